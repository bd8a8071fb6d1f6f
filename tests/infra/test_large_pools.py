"""The large tier's two GPU worker groups (one-GPU g5 workers, eight-GPU p4d/g5.48xlarge workers, and p5.48xlarge
where the stack's region offers it), each a Spot NodePool with a lower-weight on-demand fallback and its KubeRay
worker group; the stack's model picks the night's group (infra/config/worker_groups.py). The default large stack and
the committed model stacks (large-70b: Llama-3.1-70B, large-moe: Qwen3-30B-A3B) are planned, CRD-checked and priced
here, from the session's shared plans; other regions are checked from the config alone, rendered as Karpenter gets
them (infra/config/regional_types.py, infra/facts/instance_regions.json).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import StackConfigError
from infra.eks_job import base_rayjob_args
from infra.facts.instance_regions import offers
from infra.k8s.common import GPU8_POOL, GPU_RESOURCE, POOL_LABEL
from infra.k8s.karpenter import NodePoolArgs, render_node_pools
from infra.k8s.rayjob import render_rayjob
from infra.ops.checks_engine_fit import check_engine_fit
from infra.ops.plan import eight_gpu_types_line, night_workers_line
from infra.ops.stacks import offline_config, stack_estimate
from infra.pricing.estimate import format_estimate
from infra.pricing.stack_costs import pool_ceilings
from infra.pricing.table import InstancePrice, load_prices
from tests.infra.crd_schema import assert_valid

NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/llm-batch:1"
MODELS = Path(__file__).resolve().parents[1] / "workload" / "data" / "model_configs"
PRICES = load_prices()
Plan = list[dict[str, Any]]
P5 = "p5.48xlarge"
EIGHT_GPU = ["p4d.24xlarge", "g5.48xlarge"]


def _pools(plan: Plan) -> dict[str, dict[str, Any]]:
    return {item["inputs"]["metadata"]["name"]: item["inputs"] for item in plan if item["type"] == NODE_POOL}


def _requirements(pool: dict[str, Any]) -> dict[str, list[str]]:
    return {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}


@pytest.mark.parametrize("stack", ["large", "large-70b", "large-moe"])
def test_both_groups_are_spot_first_with_bounded_on_demand_fallbacks(
    plan_for: Callable[[str], Plan], crds_dir: Path, stack: str
) -> None:
    pools = _pools(plan_for(stack))
    assert sorted(pools) == ["gpu-on-demand", "gpu-spot", "gpu8-on-demand", "gpu8-spot", "head"]
    for pool in pools.values():
        assert_valid(pool, crds_dir)
    # The committed stacks are in us-west-2, which the regions table lists for the p5.
    assert offers(P5, "us-west-2")
    for group, types in (("gpu", ["g5.xlarge", "g5.2xlarge"]), ("gpu8", [*EIGHT_GPU, P5])):
        spot, fallback = pools[f"{group}-spot"], pools[f"{group}-on-demand"]
        for pool in (spot, fallback):
            assert pool["spec"]["template"]["metadata"]["labels"] == {POOL_LABEL: group}
            assert _requirements(pool)["node.kubernetes.io/instance-type"] == types
        # Karpenter tries the higher weight first: Spot, and on demand only when no Spot node can be had.
        assert _requirements(spot)["karpenter.sh/capacity-type"] == ["spot"] and spot["spec"]["weight"] == 100
        assert _requirements(fallback)["karpenter.sh/capacity-type"] == ["on-demand"]
        assert fallback["spec"]["weight"] == 10
        assert spot["spec"]["limits"][GPU_RESOURCE] == "16" and fallback["spec"]["limits"][GPU_RESOURCE] == "8"
    # Limits let Karpenter launch the largest type: two p5s on Spot (2 x 2048 GiB), one in the fallback.
    assert pools["gpu8-spot"]["spec"]["limits"]["memory"] == "4096Gi"
    assert pools["gpu8-on-demand"]["spec"]["limits"] == {"cpu": "192", "memory": "2048Gi", GPU_RESOURCE: "8"}


@pytest.mark.parametrize(
    ("region", "overrides", "p5_in"),
    [
        ("us-east-1", {}, True),
        ("eu-west-1", {}, False),  # Ireland: no p5.48xlarge in the regions table
        ("us-west-2", {"eks": {"eight_gpu": {"where_offered": []}}}, False),  # the stack opts out
    ],
)
def test_p5_joins_the_eight_gpu_pools_only_where_the_region_offers_it(
    crds_dir: Path, region: str, overrides: dict[str, Any], p5_in: bool
) -> None:
    assert offers(P5, region) is (region != "eu-west-1")
    config = offline_config("large", {**overrides, "region": region})
    spot, fallback = render_node_pools(config.eks.eight_gpu.node_pool)
    for pool in (spot, fallback):
        assert_valid(pool, crds_dir)
        assert _requirements(pool)["node.kubernetes.io/instance-type"] == [*EIGHT_GPU, *([P5] if p5_in else [])]
        # The device plugin and the eight-GPU workers select this label: a p5 node is one of theirs.
        assert pool["spec"]["template"]["metadata"]["labels"] == {POOL_LABEL: GPU8_POOL}
    line = eight_gpu_types_line("large", {**overrides, "region": region})
    if overrides:
        assert line is None  # nothing to choose, nothing said
    else:
        assert line is not None and "infra/facts/instance_regions.json, source as of 2026-07-20" in line
        assert (f"{P5} in the pools: {region} offers it" in line) is p5_in
        assert (
            f"{P5} left out: the table does not list {region} for it (it lists ap-northeast-1," in line
        ) is not p5_in


def test_a_regional_type_must_be_in_the_table_and_the_limits_must_hold_it() -> None:
    with pytest.raises(StackConfigError, match=r"g5.48xlarge is not in infra/facts/instance_regions.json"):
        offline_config("large", {"eks": {"eight_gpu": {"where_offered": ["g5.48xlarge"]}}})
    # The limits before the p5 (two p4ds' memory) would strand the second p5 worker.
    old_limits = {"name": "gpu8-spot", "pool": GPU8_POOL, "instance_types": EIGHT_GPU, "cpu_limit": "384"}
    old_limits["memory_limit"] = "2304Gi"
    with pytest.raises(StackConfigError, match=r"cannot hold eight_gpu.max_nodes \(2\) nodes of p5.48xlarge.*4096Gi"):
        offline_config("large", {"eks": {"eight_gpu": {"node_pool": old_limits}}})
    # Where the region has no p5 those limits hold the two types it lists.
    ireland = offline_config("large", {"region": "eu-west-1", "eks": {"eight_gpu": {"node_pool": old_limits}}})
    assert ireland.eks.eight_gpu.node_pool.instance_types == EIGHT_GPU


@pytest.mark.parametrize(
    ("stack", "group", "gpus", "tp", "replicas", "volume"),
    [
        ("large", "gpu", 1, 1, 8, "11Gi"),  # the embedded tiny model on the one-GPU workers
        ("large-70b", "gpu8", 8, 8, 2, "148Gi"),  # 131.4 GiB of weights: one TP-8 engine a node
        ("large-moe", "gpu8", 8, 4, 4, "70Gi"),  # 56.9 GiB: two TP-4 engines a node, one copy of the model
    ],
)
def test_the_model_decides_the_nights_worker_group(
    crds_dir: Path, stack: str, group: str, gpus: int, tp: int, replicas: int, volume: str
) -> None:
    config = offline_config(stack)
    args = base_rayjob_args(config, stack, IMAGE, "bucket")
    rayjob = render_rayjob(args)
    assert_valid(rayjob, crds_dir)
    (workers,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    pod = workers["template"]["spec"]
    assert workers["groupName"] == group and pod["nodeSelector"] == {POOL_LABEL: group}
    assert pod["containers"][0]["resources"]["limits"][GPU_RESOURCE] == gpus
    assert args.job.engine.tensor_parallel_size == tp and args.job.replicas == replicas
    assert [v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if v["name"] == "models"] == [volume]
    line = night_workers_line(stack, {})
    assert line is not None and f"worker group {group} " in line and f"{gpus // tp} engine(s) per node" in line


@pytest.mark.parametrize(("stack", "folder"), [("large-70b", "llama-3.1-70b-instruct"), ("large-moe", "qwen3-30b-a3b")])
def test_each_model_stack_fits_every_type_its_group_may_launch(stack: str, folder: str) -> None:
    """engine-plan's sizing from the model's config.json, on each type Karpenter may pick for the group."""
    fit = check_engine_fit(offline_config(stack, {"job.model_source": str(MODELS / folder)}), PRICES)
    tp = offline_config(stack).job_config("s3://b/i/", "s3://b/o/").engine.tensor_parallel_size
    assert fit.ok, fit.line
    for instance_type in ("p4d.24xlarge", "g5.48xlarge"):
        assert f"{instance_type}: {8 // tp} engine(s) x tp{tp}" in fit.line


def test_a_model_no_group_can_run_is_refused_naming_the_fix() -> None:
    llama_70b = {"job.model_source": "s3://bucket/models/llama-70b/", "job.model_weights_gib": 131.4}
    with pytest.raises(StackConfigError, match=r"131.4 GiB a GPU.*tensor_parallel_size to 8 \(the eight-GPU"):
        offline_config("large", llama_70b)
    with pytest.raises(StackConfigError, match=r"tensor_parallel_size \(3\) fits no worker group"):
        offline_config("large", {**llama_70b, "job.job_overrides": {"engine": {"tensor_parallel_size": 3}}})
    # A fallback that could not hold one node of its largest type would never launch it.
    with pytest.raises(ValueError, match="on_demand_gpu_limit"):
        NodePoolArgs(instance_types=["p4d.24xlarge"], on_demand_gpu_limit=4)


def test_the_estimate_prices_the_group_and_bounds_the_worst_hour(plan_for: Callable[[str], Plan]) -> None:
    """The night runs on the cheapest eight-GPU type at Spot (g5.48xlarge); the worst hour is every pool at its GPU
    limit at its dearest type's GPU-hour: with the p5 in the pools, the p5's on demand and on Spot."""
    estimate = stack_estimate("large-70b", plan_for("large-70b"))
    (workers,) = [item for item in estimate.items if item.item.startswith("gpu workers: 2 x g5.48xlarge spot")]
    assert workers.unit_price == PRICES.instance("us-west-2", "g5.48xlarge").spot_hourly
    ceilings = {c.pool: c for c in estimate.ceilings}
    p5, p4d = PRICES.instance("us-west-2", P5), PRICES.instance("us-west-2", "p4d.24xlarge")
    g5 = PRICES.instance("us-west-2", "g5.2xlarge")
    assert ceilings["gpu8-on-demand"].dearest_type == ceilings["gpu8-spot"].dearest_type == P5
    assert ceilings["gpu8-on-demand"].hourly_usd == pytest.approx(8 * p5.on_demand_hourly / 8)
    assert ceilings["gpu8-spot"].hourly_usd == pytest.approx(16 * p5.spot_hourly / 8)
    assert ceilings["gpu-on-demand"].hourly_usd == pytest.approx(8 * g5.on_demand_hourly)
    worst = 16 * g5.spot_hourly + 8 * g5.on_demand_hourly + 2 * p5.spot_hourly + p5.on_demand_hourly
    assert estimate.worst_case_hourly_usd == pytest.approx(worst, abs=0.01)
    assert f"at its nvidia.com/gpu limit: {worst:,.2f} USD" in format_estimate(estimate)
    # Without the p5 the same pools are bounded by the p4d's GPU-hour: the p5 is what raises the worst hour.
    without = pool_ceilings(offline_config("large-70b", {"eks": {"eight_gpu": {"where_offered": []}}}), PRICES)
    without_worst = 16 * g5.spot_hourly + 8 * g5.on_demand_hourly + 2 * p4d.spot_hourly + p4d.on_demand_hourly
    assert sum(c.hourly_usd for c in without) == pytest.approx(without_worst)
    assert without_worst < worst


def test_the_p5_prices_carry_their_own_date_and_source() -> None:
    """The p5's prices were taken after the table's (the June 2025 cut), so each region's entry says when and
    from where; a date without a source, or a source without a date, is refused."""
    for region in PRICES.regions:
        p5 = PRICES.instance(region, P5)
        assert p5.as_of is not None and p5.source is not None and "Price List API" in p5.source
        assert p5.spot_hourly < p5.on_demand_hourly
    with pytest.raises(ValidationError, match="as_of and source go together"):
        InstancePrice(vcpus=192, gpus=8, on_demand_hourly=55.04, spot_hourly=13.0, as_of="2026-07-20")
