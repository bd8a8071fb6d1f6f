"""The deploying identity's policy (docs/deployer-policy.json) covers every resource type the three plans create."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.ops import deployer_policy
from infra.ops.deployer_policy import UnknownResourceType, document_for, services_for

Plan = list[dict[str, Any]]


def test_the_committed_document_is_the_one_the_plans_need(
    plan_for: Callable[[str], Plan], features_on: Callable[[str], Plan]
) -> None:
    """Every stack with its features off and on (the Batch API, serving: `features_on` plans `OPT_IN`)."""
    assert set(deployer_policy.OPT_IN) == set(deployer_policy.STACKS)
    plans = [plan_for(stack) for stack in deployer_policy.STACKS]
    plans += [features_on(stack) for stack in deployer_policy.STACKS]
    committed = json.loads(deployer_policy.DOCUMENT.read_text())
    assert committed == document_for(plans), "stale: run python -m infra.ops.deployer_policy"


def test_every_aws_service_in_the_plans_is_granted(
    plan_for: Callable[[str], Plan], features_on: Callable[[str], Plan]
) -> None:
    granted = {
        action.split(":")[0] for action in json.loads(deployer_policy.DOCUMENT.read_text())["Statement"][0]["Action"]
    }
    for stack in deployer_policy.STACKS:
        for item in [*plan_for(stack), *features_on(stack)]:
            if item["type"].startswith("aws:"):
                assert services_for([item["type"]]) <= granted, item["type"]


def test_a_type_the_tables_do_not_know_fails_naming_it() -> None:
    with pytest.raises(UnknownResourceType, match=r"aws:rds/instance:Instance"):
        services_for(["aws:s3/bucket:Bucket", "aws:rds/instance:Instance"])


def test_kubernetes_objects_and_components_need_no_aws_permission() -> None:
    assert (
        services_for(["kubernetes:core/v1:Namespace", "llmbatch:storage:DataBucket", "pulumi:providers:aws"]) == set()
    )
    assert services_for(["eks:index:Cluster"]) >= {"eks", "ec2", "iam"}
