"""Plan checks on what the stack's keys let in: `volume-keys` and `alert-keys`.

`volume-keys`: every node volume is encrypted with the stack key, and whoever launches the node can use it.

A volume on AWS's own EBS key (no key named) is refused: the stack's data on a node's disk (model weights,
the Hub token's file, spilled Ray objects) is then readable under a key the stack's policy does not control.

EC2 Auto Scaling launches the small tier's Spot node (and an EKS managed node group's nodes) as its
service-linked role, AWSServiceRoleForAutoScaling. IAM policies cannot be attached to that role, so a
customer-managed key must let it in through the key policy, or every launch fails with "Client.InternalError:
Client error on launch" (AWS: "Required AWS KMS key policy for use with encrypted volumes"): use of the key,
and CreateGrant limited to AWS resources. Karpenter launches with its controller's own role, which the key
reaches through IAM: the key policy must delegate to the account and an IAM policy in the plan must allow
the controller CreateGrant for AWS resources on the key.

`alert-keys`: every KMS-encrypted topic that EventBridge may publish to (the alerts topics: Spot interruption
and rebalance notices, failed nights) is on a key that lets events.amazonaws.com make data keys without a
condition on aws:SourceAccount or aws:SourceArn, which EventBridge's deliveries to an encrypted topic do not carry
(SNS developer guide: compatibility between event sources from AWS services and encrypted topics); under such a
condition every delivery ends as FailedInvocations and the notice is dropped.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping
from typing import Any

from infra.rules.plan_view import (
    Plan,
    Resource,
    Violation,
    as_json,
    as_list,
    is_node_class,
    label,
    of_type,
    require_matches,
    statements,
)

NAME = "volume-keys"
KEY = "aws:kms/key:Key"
# The stack key is the key of the EncryptionKey component named `kms` (infra/components/foundation.py); the
# large tier's us-east-1 billing key is another EncryptionKey, `observability-billing-kms`. By the parent URN's
# end: the components above it differ between the program's versions, and the real engine's URNs and the mock's.
STACK_KEY_PARENT = "llmbatch:kms:EncryptionKey::kms"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
IAM_DOCUMENTS = ("aws:iam/policy:Policy", "aws:iam/rolePolicy:RolePolicy")
# The service-linked role AWS creates (a custom suffix is allowed: AWSServiceRoleForAutoScaling_<suffix>).
AUTOSCALING_ROLE = re.compile(
    r"^arn:[a-z-]+:iam::\d{12}:role/aws-service-role/autoscaling\.amazonaws\.com/AWSServiceRoleForAutoScaling(_\S+)?$"
)
USE_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey")


def _allows(statement: Mapping[str, Any], action: str) -> bool:
    """Whether an Allow statement grants `action` (IAM action patterns: `*` wildcards, any case)."""
    if statement.get("Effect") != "Allow":
        return False
    granted = [str(item).lower() for item in as_list(statement.get("Action"))]
    return any(fnmatch.fnmatchcase(action.lower(), pattern) for pattern in granted)


def _for_aws_resources_only(statement: Mapping[str, Any]) -> bool:
    condition = (statement.get("Condition") or {}).get("Bool") or {}
    return str(condition.get("kms:GrantIsForAWSResource")).lower() == "true"


def _principals(statement: Mapping[str, Any]) -> list[str]:
    principal = statement.get("Principal")
    if not isinstance(principal, dict):
        return []
    return [str(arn) for arn in as_list(principal.get("AWS"))]


def autoscaling_problems(key_policy: Any) -> list[str]:
    """What the key policy lacks for EC2 Auto Scaling's service-linked role to launch with the key."""
    granted = [
        statement
        for statement in statements(key_policy)
        if any(AUTOSCALING_ROLE.match(arn) for arn in _principals(statement))
    ]
    problems = []
    missing = [action for action in USE_ACTIONS if not any(_allows(s, action) for s in granted)]
    if missing:
        problems.append(f"the key policy does not let AWSServiceRoleForAutoScaling use the key ({missing})")
    if not any(_allows(s, "kms:CreateGrant") and _for_aws_resources_only(s) for s in granted):
        problems.append(
            "the key policy does not let AWSServiceRoleForAutoScaling CreateGrant with "
            "kms:GrantIsForAWSResource (needed to attach the encrypted volume)"
        )
    return problems


def _delegates_to_iam(key_policy: Any) -> bool:
    """Whether the account (`:root`) may CreateGrant, so an IAM policy can pass that on to a role."""
    return any(
        any(arn.endswith(":root") for arn in _principals(statement)) and _allows(statement, "kms:CreateGrant")
        for statement in statements(key_policy)
    )


def _iam_grants_create_grant(plan: Plan, key_arn: str) -> bool:
    for item in of_type(plan, *IAM_DOCUMENTS):
        for statement in statements(item["inputs"].get("policy")):
            resources = [str(resource) for resource in as_list(statement.get("Resource"))]
            if (
                _allows(statement, "kms:CreateGrant")
                and _for_aws_resources_only(statement)
                and (key_arn in resources or "*" in resources)
            ):
                return True
    return False


def _volume_keys(mappings: Any, *, ebs_key: str) -> Iterator[str | None]:
    """The key of each EBS volume a template or node class creates (None: AWS's own EBS key)."""
    for device in as_list(mappings):
        ebs = device.get("ebs") or {}
        if ebs:
            yield ebs.get(ebs_key) or None


def check_volume_keys(plan: Plan) -> list[Violation]:
    """Every launch template and Karpenter EC2NodeClass volume on the stack key, which the launching role can use."""
    keys: dict[str, Resource] = {str(key.get("outputs", {}).get("arn")): key for key in of_type(plan, KEY)}
    keys.update({str(key.get("id")): key for key in of_type(plan, KEY)})
    violations: list[Violation] = []
    matched = 0
    launches: list[tuple[Resource, str | None, str]] = []
    for item in of_type(plan, LAUNCH_TEMPLATE):
        for volume_key in _volume_keys(item["inputs"].get("blockDeviceMappings"), ebs_key="kmsKeyId"):
            launches.append((item, volume_key, "autoscaling"))
    for item in plan:
        if item.get("custom") and is_node_class(item["type"]):
            spec = item["inputs"].get("spec") or {}
            for volume_key in _volume_keys(spec.get("blockDeviceMappings"), ebs_key="kmsKeyID"):
                launches.append((item, volume_key, "karpenter"))
    for item, key_arn, launcher in launches:
        matched += 1
        if key_arn is None:
            violations.append(
                Violation(NAME, label(item), "volumes use AWS's own EBS key (no kmsKeyId/kmsKeyID): not the stack key")
            )
            continue
        key = keys.get(key_arn)
        if key is None:
            violations.append(
                Violation(NAME, label(item), f"volumes use key {key_arn}, which is not in this plan: unchecked")
            )
            continue
        if not str(key.get("parent")).endswith(STACK_KEY_PARENT):
            violations.append(Violation(NAME, label(item), f"volumes use {label(key)}, not the stack key"))
            continue
        policy = as_json(key["inputs"].get("policy"))
        if launcher == "autoscaling":
            problems = autoscaling_problems(policy)
        else:
            problems = []
            if not _delegates_to_iam(policy):
                problems.append("the key policy does not delegate to IAM, so Karpenter's role cannot use the key")
            if not _iam_grants_create_grant(plan, key_arn):
                problems.append("no IAM policy lets Karpenter CreateGrant on the key for AWS resources")
        violations += [Violation(NAME, label(item), f"{label(key)}: {problem}") for problem in problems]
    require_matches(NAME, matched, "launch template or EC2NodeClass volume")
    return violations


ALERT_KEYS = "alert-keys"
TOPIC = "aws:sns/topic:Topic"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"
EVENTBRIDGE = "events.amazonaws.com"
# Condition keys EventBridge's delivery to an encrypted topic does not carry (its KMS calls have no source).
_SOURCE_KEYS = ("aws:sourceaccount", "aws:sourcearn", "aws:sourceorgid", "aws:sourceorgpaths")


def _services(statement: Mapping[str, Any]) -> list[str]:
    principal = statement.get("Principal")
    return [str(s) for s in as_list(principal.get("Service"))] if isinstance(principal, dict) else []


def _source_conditions(statement: Mapping[str, Any]) -> list[str]:
    return [
        key
        for block in (statement.get("Condition") or {}).values()
        if isinstance(block, dict)
        for key in block
        if key.lower() in _SOURCE_KEYS
    ]


def eventbridge_key_problems(key_policy: Any) -> list[str]:
    """What keeps EventBridge from encrypting a delivery with the key: no statement for it, or one it cannot match."""
    usable = [
        statement
        for statement in statements(key_policy)
        if EVENTBRIDGE in _services(statement)
        and all(_allows(statement, action) for action in ("kms:GenerateDataKey", "kms:Decrypt"))
    ]
    if not usable:
        return ["the key policy does not let events.amazonaws.com GenerateDataKey* and Decrypt"]
    if all(_source_conditions(statement) for statement in usable):
        keys = sorted({key for statement in usable for key in _source_conditions(statement)})
        return [f"EventBridge may use the key only under {keys}, which its deliveries do not carry"]
    return []


def check_alert_keys(plan: Plan) -> list[Violation]:
    """Every encrypted topic EventBridge may publish to is on a key EventBridge can use (Spot notices, nights)."""
    keys: dict[str, Resource] = {str(key.get("outputs", {}).get("arn")): key for key in of_type(plan, KEY)}
    policies = {str(item["inputs"].get("arn")): item for item in of_type(plan, TOPIC_POLICY)}
    violations: list[Violation] = []
    matched = 0
    for topic in of_type(plan, TOPIC):
        policy = policies.get(str(topic.get("outputs", {}).get("arn")))
        publishes = policy is not None and any(
            EVENTBRIDGE in _services(s) and _allows(s, "sns:Publish") for s in statements(policy["inputs"]["policy"])
        )
        key_arn = topic["inputs"].get("kmsMasterKeyId")
        if not publishes or not key_arn:
            continue
        matched += 1
        key = keys.get(str(key_arn))
        if key is None:
            violations.append(Violation(ALERT_KEYS, label(topic), f"its key {key_arn} is not in this plan: unchecked"))
            continue
        problems = eventbridge_key_problems(as_json(key["inputs"].get("policy")))
        violations += [Violation(ALERT_KEYS, label(topic), f"{label(key)}: {problem}") for problem in problems]
    require_matches(ALERT_KEYS, matched, "encrypted topic EventBridge publishes to")
    return violations
