"""IAM roles for Kubernetes service accounts (IRSA): the one way a pod here gets AWS credentials.

Nodes keep IMDSv2 with a hop limit of 1, so pods cannot borrow the node's role; each workload gets a role
only its own service account, in its own namespace, can assume.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws


def trust_policy(oidc_provider_arn: str, oidc_provider_url: str, namespace: str, service_account: str) -> str:
    """The role's trust policy: web identity from the cluster's OIDC issuer, for this one service account."""
    issuer = oidc_provider_url.removeprefix("https://")
    document: dict[str, Any] = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": oidc_provider_arn},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                        f"{issuer}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ],
    }
    return json.dumps(document)


def service_account_role(
    name: str,
    *,
    oidc_provider_arn: pulumi.Input[str],
    oidc_provider_url: pulumi.Input[str],
    namespace: str,
    service_account: str,
    parent: pulumi.Resource,
    policy: pulumi.Input[str] | None = None,
    policy_arns: list[pulumi.Input[str]] | None = None,
) -> aws.iam.Role:
    """A role for `namespace/service_account`: `policy` inline (it belongs to that workload alone) and/or
    managed policies shared with other tiers (`policy_arns`)."""
    trust = pulumi.Output.all(oidc_provider_arn, oidc_provider_url).apply(
        lambda values: trust_policy(values[0], values[1], namespace, service_account)
    )
    role = aws.iam.Role(
        f"{name}-role",
        assume_role_policy=trust,
        description=f"IRSA: {namespace}/{service_account}",
        opts=pulumi.ResourceOptions(parent=parent),
    )
    if policy is not None:
        aws.iam.RolePolicy(f"{name}-policy", role=role.name, policy=policy, opts=pulumi.ResourceOptions(parent=parent))
    for index, policy_arn in enumerate(policy_arns or []):
        aws.iam.RolePolicyAttachment(
            f"{name}-attach-{index}",
            role=role.name,
            policy_arn=policy_arn,
            opts=pulumi.ResourceOptions(parent=parent),
        )
    return role
