"""Karpenter NodePool and EC2NodeClass: checked against the real CRDs, and the rules the schema cannot see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra import versions
from infra.aws_context import AwsContext
from infra.components.karpenter import controller_policy
from infra.k8s.common import GPU_RESOURCE, GPU_TAINT_KEY
from infra.k8s.karpenter import (
    DISCOVERY_TAG,
    NodeClassArgs,
    NodePoolArgs,
    render_node_class,
    render_node_pool,
)
from infra.k8s.rayjob import render_rayjob
from tests.infra.crd_schema import assert_valid, crd_errors
from tests.infra.k8s_fixtures import large_args, node_class_args

DATA = Path(__file__).parent / "data"


def test_node_pool_and_node_class_match_the_karpenter_crds(crds_dir: Path) -> None:
    assert_valid(render_node_pool(NodePoolArgs()), crds_dir)
    assert_valid(render_node_class(node_class_args()), crds_dir)
    spot_only = NodePoolArgs(on_demand_fallback=False, instance_types=["g5.xlarge"], consolidate_after="5m")
    assert_valid(render_node_pool(spot_only), crds_dir)
    with_key = node_class_args().model_copy(update={"volume_kms_key_id": "alias/llm-batch"})
    assert_valid(render_node_class(with_key), crds_dir)


def test_schema_check_catches_a_bad_budget_and_a_typo(crds_dir: Path) -> None:
    pool = render_node_pool(NodePoolArgs())
    pool["spec"]["disruption"]["budgets"].append({"nodes": "ten"})
    pool["spec"]["disruption"]["consolidateAfter"] = "5 minutes"
    node_class = render_node_class(node_class_args())
    node_class["spec"]["metadataOptions"]["httpToken"] = "required"
    errors = "\n".join(crd_errors(pool, crds_dir) + crd_errors(node_class, crds_dir))
    assert "budgets.2.nodes" in errors
    assert "consolidateAfter" in errors
    assert "'httpToken' was unexpected" in errors


def test_node_pool_is_spot_first_bounded_and_consolidates_after_five_minutes() -> None:
    spec = render_node_pool(NodePoolArgs())["spec"]
    requirements = {item["key"]: item["values"] for item in spec["template"]["spec"]["requirements"]}
    assert requirements["node.kubernetes.io/instance-type"] == ["g5.xlarge", "g5.2xlarge"]
    assert requirements["karpenter.sh/capacity-type"] == ["spot", "on-demand"]
    assert spec["limits"] == {"cpu": "256", "memory": "1280Gi", GPU_RESOURCE: "16"}
    assert spec["disruption"]["consolidationPolicy"] == "WhenEmptyOrUnderutilized"
    assert spec["disruption"]["consolidateAfter"] == "300s"
    assert {"nodes": "1", "reasons": ["Underutilized"]} in spec["disruption"]["budgets"]
    assert spec["template"]["spec"]["taints"] == [{"key": GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert spec["template"]["spec"]["nodeClassRef"]["name"] == "gpu"


def test_node_class_pins_the_ami_and_locks_the_node_down() -> None:
    args = node_class_args()
    spec = render_node_class(args)["spec"]
    assert spec["amiSelectorTerms"] == [{"alias": versions.EKS_AMI_ALIAS}]
    assert spec["metadataOptions"]["httpTokens"] == "required"
    assert spec["metadataOptions"]["httpPutResponseHopLimit"] == 1
    (device,) = spec["blockDeviceMappings"]
    assert device["ebs"]["encrypted"] is True
    assert (
        spec["subnetSelectorTerms"]
        == spec["securityGroupSelectorTerms"]
        == [{"tags": {DISCOVERY_TAG: "llm-batch-large"}}]
    )
    assert spec["associatePublicIPAddress"] is False
    assert spec["tags"] == args.tags and spec["role"] == args.node_role


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    for toleration in tolerations:
        if toleration["key"] != taint["key"] or toleration.get("effect", taint["effect"]) != taint["effect"]:
            continue
        if toleration["operator"] == "Exists" or toleration.get("value") == taint["value"]:
            return True
    return False


def test_ray_workers_land_on_the_pool_and_the_head_stays_off_it() -> None:
    """What Karpenter matches: the worker's selector against the pool's labels, tolerations against taints."""
    template = render_node_pool(NodePoolArgs())["spec"]["template"]
    rayjob = render_rayjob(large_args())
    worker = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    taints = template["spec"]["taints"]
    assert worker["nodeSelector"].items() <= template["metadata"]["labels"].items()
    assert all(_tolerates(worker["tolerations"], taint) for taint in taints)
    assert not all(_tolerates(head.get("tolerations", []), taint) for taint in taints)
    assert not head["nodeSelector"].items() <= template["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"instance_types": ["g5.mega"]}, "unknown instance type 'g5.mega'"),
        ({"instance_types": ["m5.xlarge"]}, "has no GPU"),
        ({"instance_types": []}, "instance_types is empty"),
        ({"instance_types": ["p4d.24xlarge"], "memory_limit": "1024Gi"}, r"p4d.24xlarge .* larger than the pool's"),
        ({"instance_types": ["p4d.24xlarge"], "gpu_limit": 4}, r"p4d.24xlarge .* larger than the pool's limits"),
        ({"cpu_limit": "lots"}, "cpu_limit 'lots' is not a Kubernetes quantity"),
        ({"consolidate_after": "5 minutes"}, "consolidate_after"),
        ({"budgets": [{"nodes": "ten"}]}, "disruption budget nodes"),
        ({"name": "GPU"}, "name"),
    ],
)
def test_bad_node_pool_args_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        NodePoolArgs.model_validate(changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ami_alias": "al2023@latest"}, "pinned alias"),
        ({"ami_alias": "ami-0123456789abcdef0"}, "pinned alias"),
        ({"tags": {"kubernetes.io/cluster/x": "owned"}}, "set by Karpenter itself"),
        ({"tags": {"karpenter.sh/nodepool": "x"}}, "set by Karpenter itself"),
        ({"volume_size_gib": 5}, "volume_size_gib"),
    ],
)
def test_bad_node_class_args_are_refused(changes: dict[str, Any], message: str) -> None:
    data = node_class_args().model_dump()
    data.update(changes)
    with pytest.raises(ValidationError, match=message):
        NodeClassArgs.model_validate(data)


def test_gpu_nodes_keep_the_model_cache_on_their_instance_store() -> None:
    """The node class stripes the instance store as the node's ephemeral storage, and every GPU type a committed
    stack launches has an instance store that holds the `models` volume of a 70B model (131.4 GiB of weights, so
    it never falls back to gp3)."""
    from infra.k8s.instance_types import INSTANCE_STORE_GB
    from infra.k8s.model_disk import disk_problem
    from infra.ops.stacks import offline_config

    assert render_node_class(node_class_args())["spec"]["instanceStorePolicy"] == "RAID0"
    for stack in ("medium", "large"):
        eks = offline_config(stack).eks
        assert eks is not None
        types = eks.node_pool.instance_types if eks.karpenter_enabled else [eks.gpu_instance_type]
        for instance_type in types:
            assert instance_type in INSTANCE_STORE_GB, (stack, instance_type)
            assert disk_problem(131.4, instance_type, root_volume_gib=0) is None, (stack, instance_type)


def test_the_controller_may_do_what_upstreams_policy_for_the_pinned_version_grants() -> None:
    """Every action of Karpenter's own controller policies for the pinned chart (a copy of upstream's
    CloudFormation, with its source, in tests/infra/data) is granted, or withheld with the reason written down."""
    upstream = json.loads(
        (DATA / f"karpenter_controller_actions_v{versions.HELM_CHARTS['karpenter'][1]}.json").read_text()
    )
    assert upstream["version"] == versions.HELM_CHARTS["karpenter"][1]
    context = AwsContext("123456789012", "aws", "us-west-2", "amazonaws.com")
    policy = controller_policy(
        "c",
        context,
        context.arn("iam", "role/c-karpenter-node", region=False),
        context.arn("sqs", "c"),
        context.arn("kms", "key/k"),
    )
    granted = {action for st in policy["Statement"] for action in _listed(st["Action"])}
    wanted = {action for actions in upstream["controller_policies"].values() for action in actions}
    assert "ec2:DescribeInstanceStatus" in wanted  # the health checks' read
    assert sorted(wanted - granted - set(upstream["withheld"])) == []
    assert not set(upstream["withheld"]) & granted  # a withheld action that is granted after all: drop its reason


def _listed(action: str | list[str]) -> list[str]:
    return [action] if isinstance(action, str) else action
