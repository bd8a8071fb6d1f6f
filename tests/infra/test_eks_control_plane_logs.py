"""Issue 65, finding 2: the EKS control plane's log group is the stack's. EKS writes its five log types to
`/aws/eks/<cluster>/cluster` and creates that group itself when it is missing (no retention, AWS's key, kept
after `pulumi destroy`); the program declares it first, with the stack's retention and key."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.ops.stacks import offline_config
from infra.rules import registry

Plan = list[dict[str, Any]]
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_the_control_plane_log_group_is_declared_before_the_cluster_on_the_stack_key(
    plan_for: Callable[[str], Plan], stack: str
) -> None:
    plan = plan_for(stack)
    (group,) = [item for item in plan if item["type"] == LOG_GROUP and item["name"] == "eks-control-plane-logs"]
    (key,) = [item for item in plan if item["type"] == "aws:kms/key:Key" and item["name"] == "kms-key"]
    (cluster,) = [item for item in plan if item["name"] == "eks-cluster"]
    assert group["inputs"]["name"] == f"/aws/eks/llm-batch-{stack}/cluster"
    assert group["inputs"]["retentionInDays"] == offline_config(stack).monitoring.log_retention_days
    assert group["inputs"]["kmsKeyId"] == key["outputs"]["arn"]
    # Created first, so EKS finds it rather than making its own (which the program would then fail to create).
    assert group["urn"] in cluster["dependencies"]
    # The key lets CloudWatch Logs use it for this one group beside the stack's prefix, and the rule agrees.
    (logs,) = [s for s in json.loads(key["inputs"]["policy"])["Statement"] if s["Sid"] == "CloudWatchLogs"]
    assert group["outputs"]["arn"] in logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    assert registry.RULES["key-logs-scope"].check(plan) == []


def test_the_small_tier_has_no_cluster_log_group_and_no_key_grant_for_one(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("small")
    assert not [item for item in plan if item["type"] == LOG_GROUP and "/aws/eks/" in item["inputs"]["name"]]
    (key,) = [item for item in plan if item["type"] == "aws:kms/key:Key" and item["name"] == "kms-key"]
    assert "/aws/eks/" not in key["inputs"]["policy"]
