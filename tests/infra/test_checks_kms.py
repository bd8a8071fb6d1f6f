"""The node-volume key check (infra/rules/checks_kms.py), shown to fail on what it guards against.

Each negative test breaks one thing in a copy of a real stack's plan (the Pulumi program run under mocks),
the way tests/infra/test_policy.py does; every stack's plan passing it is part of test_policy. The same for
`alert-keys` (issue 33): EventBridge must be able to encrypt its deliveries to the encrypted alerts topics.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.aws_context import AwsContext
from infra.components.kms import key_policy
from infra.rules.checks_kms import autoscaling_problems, check_alert_keys, check_volume_keys, eventbridge_key_problems
from tests.infra import plan_select

Plan = list[dict[str, Any]]
CONTEXT = AwsContext(account_id="123456789012", partition="aws", region="us-east-1", dns_suffix="amazonaws.com")
AUTOSCALING_ROLE = (
    "arn:aws:iam::123456789012:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
)


def _copy(plan_for: Callable[[str], Plan], stack: str) -> Plan:
    return copy.deepcopy(plan_for(stack))


def _problems(plan: Plan) -> str:
    return "\n".join(str(violation) for violation in check_volume_keys(plan))


def test_the_small_key_lets_auto_scaling_launch_encrypted_volumes(plan_for: Callable[[str], Plan]) -> None:
    """The Spot node's root volume is on the stack key; the key policy names the looked-up service role."""
    plan = plan_for("small")
    key = plan_select.stack_key(plan)
    (template,) = [item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    assert template["inputs"]["blockDeviceMappings"][0]["ebs"]["kmsKeyId"] == key["outputs"]["arn"]
    statements = {s.get("Sid"): s for s in json.loads(key["inputs"]["policy"])["Statement"]}
    grant = statements["VolumeLaunchersGrantToAwsResources"]
    assert grant["Principal"] == {"AWS": [AUTOSCALING_ROLE]}
    assert grant["Action"] == "kms:CreateGrant"
    assert grant["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": True}}
    assert check_volume_keys(plan) == []


def test_a_key_without_the_launcher_statements_fails(plan_for: Callable[[str], Plan]) -> None:
    plan = _copy(plan_for, "small")
    key = plan_select.stack_key(plan)
    policy = json.loads(key["inputs"]["policy"])
    policy["Statement"] = [s for s in policy["Statement"] if not s.get("Sid", "").startswith("VolumeLaunchers")]
    key["inputs"]["policy"] = json.dumps(policy)
    problems = _problems(plan)
    assert "gpu-node-template" in problems
    assert "does not let AWSServiceRoleForAutoScaling use the key" in problems
    assert "CreateGrant with kms:GrantIsForAWSResource" in problems


def test_a_grant_without_the_aws_resource_condition_fails() -> None:
    """CreateGrant for anything at all is not what AWS documents, nor what the check accepts."""
    policy = key_policy(CONTEXT, [AUTOSCALING_ROLE])
    for statement in policy["Statement"]:
        if statement.get("Sid") == "VolumeLaunchersGrantToAwsResources":
            del statement["Condition"]
    (problem,) = autoscaling_problems(policy)
    assert "GrantIsForAWSResource" in problem
    assert autoscaling_problems(key_policy(CONTEXT, [AUTOSCALING_ROLE])) == []
    assert len(autoscaling_problems(key_policy(CONTEXT))) == 2


def test_a_volume_on_a_key_outside_the_plan_is_reported(plan_for: Callable[[str], Plan]) -> None:
    plan = _copy(plan_for, "small")
    (template,) = [item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    template["inputs"]["blockDeviceMappings"][0]["ebs"]["kmsKeyId"] = "arn:aws:kms:us-east-1:210987654321:key/x"
    assert "not in this plan" in _problems(plan)


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_eks_node_volumes_are_on_the_stack_key(plan_for: Callable[[str], Plan], stack: str) -> None:
    """Managed node groups' templates and Karpenter's node class name the stack key, and the plan passes."""
    plan = plan_for(stack)
    key_arn = plan_select.stack_key(plan)["outputs"]["arn"]
    templates = [item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    node_classes = [item for item in plan if item["type"].endswith(":EC2NodeClass")]
    assert templates and (node_classes or stack == "medium")
    for template in templates:
        assert [d["ebs"]["kmsKeyId"] for d in template["inputs"]["blockDeviceMappings"]] == [key_arn]
    for node_class in node_classes:
        assert [d["ebs"]["kmsKeyID"] for d in node_class["inputs"]["spec"]["blockDeviceMappings"]] == [key_arn]
    assert check_volume_keys(plan) == []


def test_a_node_class_on_the_stack_key_needs_karpenter_let_in(plan_for: Callable[[str], Plan]) -> None:
    """Without the controller's grant statement, Karpenter could not attach the volumes it launches."""
    plan = _copy(plan_for, "large")
    controller = next(item for item in plan if item["name"] == "karpenter-controller-policy")
    policy = json.loads(controller["inputs"]["policy"])
    policy["Statement"] = [s for s in policy["Statement"] if s.get("Sid") != "NodeVolumesGrantToEbs"]
    controller["inputs"]["policy"] = json.dumps(policy)
    assert "no IAM policy lets Karpenter CreateGrant on the key" in _problems(plan)


def test_a_node_volume_on_another_key_is_reported(plan_for: Callable[[str], Plan]) -> None:
    """The large tier's us-east-1 billing key is in the plan too, but it is not the stack key."""
    plan = _copy(plan_for, "large")
    other = next(
        item for item in plan if item["type"] == "aws:kms/key:Key" and item["urn"] != plan_select.stack_key(plan)["urn"]
    )
    (template,) = [item for item in plan if item["name"] == "nodes-system-lt"]  # the always-on node
    template["inputs"]["blockDeviceMappings"][0]["ebs"]["kmsKeyId"] = other["outputs"]["arn"]
    assert f"volumes use aws:kms/key:Key {other['name']}, not the stack key" in _problems(plan)


def _topics_on_keys(plan: Plan) -> dict[str, str]:
    """Each encrypted topic's name -> its key's ARN."""
    return {
        str(item["inputs"]["name"]): str(item["inputs"]["kmsMasterKeyId"])
        for item in plan
        if item["type"] == "aws:sns/topic:Topic" and item["inputs"].get("kmsMasterKeyId")
    }


def _key_policy(plan: Plan, key: dict[str, Any]) -> dict[str, Any]:
    policy: dict[str, Any] = json.loads(key["inputs"]["policy"])
    return policy


def test_eventbridge_may_encrypt_to_every_alerts_topic_without_a_source_condition(
    plan_for: Callable[[str], Plan],
) -> None:
    """Large has two: the stack's alerts topic and the us-east-1 billing topic, each on its own key."""
    plan = plan_for("large")
    topics = _topics_on_keys(plan)
    assert {"llm-batch-large-alerts", "llm-batch-large-billing-alerts"} <= set(topics)
    keys = {item["outputs"]["arn"]: item for item in plan if item["type"] == "aws:kms/key:Key"}
    for key_arn in topics.values():
        statements = {s["Sid"]: s for s in _key_policy(plan, keys[key_arn])["Statement"]}
        assert statements["EventBridgeAlerts"]["Principal"] == {"Service": "events.amazonaws.com"}
        assert "Condition" not in statements["EventBridgeAlerts"]
        # The other publishers keep theirs.
        assert statements["AlertPublishers"]["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}
        assert "events.amazonaws.com" not in statements["AlertPublishers"]["Principal"]["Service"]
    assert check_alert_keys(plan) == []


def test_eventbridge_under_source_account_on_the_key_fails(plan_for: Callable[[str], Plan]) -> None:
    """The key policy as it was before issue 33: EventBridge among the publishers under aws:SourceAccount."""
    plan = _copy(plan_for, "small")
    key = plan_select.stack_key(plan)
    policy = _key_policy(plan, key)
    policy["Statement"] = [s for s in policy["Statement"] if s.get("Sid") != "EventBridgeAlerts"]
    publishers = next(s for s in policy["Statement"] if s.get("Sid") == "AlertPublishers")
    publishers["Principal"]["Service"].append("events.amazonaws.com")
    key["inputs"]["policy"] = json.dumps(policy)
    (violation,) = check_alert_keys(plan)
    assert "llm-batch-small-alerts" in str(violation) or "alerts-topic" in str(violation)
    assert "only under ['aws:SourceAccount']" in str(violation)


def test_a_key_without_eventbridge_fails_and_the_check_needs_a_topic() -> None:
    policy = key_policy(CONTEXT)
    assert eventbridge_key_problems(policy) == []
    policy["Statement"] = [s for s in policy["Statement"] if s.get("Sid") != "EventBridgeAlerts"]
    (problem,) = eventbridge_key_problems(policy)
    assert "does not let events.amazonaws.com GenerateDataKey* and Decrypt" in problem
    with pytest.raises(Exception, match="nothing was checked"):
        check_alert_keys([])
