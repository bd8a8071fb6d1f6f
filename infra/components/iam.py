"""IAM pieces several components build the same way: a service's trust policy, a service role with its inline
policy, the TLS-only statement of resource policies, and the log group, role and policy of each Lambda function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming


def policy_document(statements: list[dict[str, Any]]) -> str:
    """An IAM policy document (JSON) of `statements`."""
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def service_trust(service: str, source_account: str | None = None) -> str:
    """A trust policy letting `service` (e.g. "lambda.amazonaws.com") assume the role.

    With `source_account`, only on that account's behalf (no confused deputy). EC2 roles take none: instances
    assume their role themselves, without an aws:SourceAccount in the request.
    """
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
    if source_account is not None:
        statement["Condition"] = {"StringEquals": {"aws:SourceAccount": source_account}}
    return policy_document([statement])


def service_role(
    name: str,
    *,
    role_name: str,
    service: str,
    account_id: str,
    policy: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> aws.iam.Role:
    """`{name}-role`, assumable by `service` on `account_id`'s behalf only, with inline policy `{name}-policy`."""
    role = aws.iam.Role(
        f"{name}-role", name=role_name, assume_role_policy=service_trust(service, account_id), opts=opts
    )
    aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy, opts=opts)
    return role


def via_services(key_arn: str, *services: str) -> dict[str, Any]:
    """A condition that lets a role use a key only through the named AWS services (kms:ViaService), in the
    key's region: a role that only ever reaches the key through S3, Secrets Manager or SNS cannot decrypt
    with it directly, so its credentials alone do not open the key."""
    _, partition, _, region, *_ = key_arn.split(":")
    suffix = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    return {"StringEquals": {"kms:ViaService": [f"{service}.{region}.{suffix}" for service in services]}}


def deny_insecure_transport(action: str, resource: str | list[str]) -> dict[str, Any]:
    """A resource-policy statement refusing `action` on `resource` to anyone not calling over TLS."""
    return {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": action,
        "Resource": resource,
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }


@dataclass(frozen=True)
class FunctionIdentity:
    """What a Lambda function runs as and logs to."""

    log_group: aws.cloudwatch.LogGroup
    role: aws.iam.Role


def function_identity(
    name: str,
    *,
    stack: str,
    function: str,
    lambda_service: str,
    account_id: str,
    key_arn: pulumi.Input[str],
    log_retention_days: int,
    policy: Callable[[pulumi.Output[str]], pulumi.Input[str]],
    opts: pulumi.ResourceOptions,
) -> FunctionIdentity:
    """`{name}-logs`, `{name}-role` and `{name}-policy` of the stack's function `function`.

    The log group sits under /llm-batch/<stack>/ because the stack key lets CloudWatch Logs encrypt only that
    namespace. `policy` gets the log group's ARN and returns the role's inline policy document (JSON).
    """
    log_group = aws.cloudwatch.LogGroup(
        f"{name}-logs",
        name=f"{naming.log_group_prefix(stack)}{function}",
        retention_in_days=log_retention_days,
        kms_key_id=key_arn,
        opts=opts,
    )
    role = service_role(
        name,
        role_name=naming.child(stack, function),
        service=lambda_service,
        account_id=account_id,
        policy=policy(log_group.arn),
        opts=opts,
    )
    return FunctionIdentity(log_group=log_group, role=role)
