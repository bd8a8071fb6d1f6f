"""The large tier's two GPU worker groups (one-GPU g5 workers, eight-GPU p4d/g5.48xlarge workers), each a Spot
NodePool with a lower-weight on-demand fallback and its KubeRay worker group; the stack's model picks the night's
group (infra/config/worker_groups.py). The default large stack and the committed model stacks (large-70b:
Llama-3.1-70B, large-moe: Qwen3-30B-A3B) are planned, CRD-checked and priced here, from the session's shared plans.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.config import StackConfigError
from infra.eks_job import base_rayjob_args
from infra.k8s.common import GPU_RESOURCE, POOL_LABEL
from infra.k8s.karpenter import NodePoolArgs
from infra.k8s.rayjob import render_rayjob
from infra.ops.checks_engine_fit import check_engine_fit
from infra.ops.plan import night_workers_line
from infra.ops.stacks import offline_config, stack_estimate
from infra.pricing.estimate import format_estimate
from infra.pricing.table import load_prices
from tests.infra.crd_schema import assert_valid

NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/llm-batch:1"
MODELS = Path(__file__).resolve().parents[1] / "workload" / "data" / "model_configs"
PRICES = load_prices()
Plan = list[dict[str, Any]]


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
    for group, types in (("gpu", ["g5.xlarge", "g5.2xlarge"]), ("gpu8", ["p4d.24xlarge", "g5.48xlarge"])):
        spot, fallback = pools[f"{group}-spot"], pools[f"{group}-on-demand"]
        for pool in (spot, fallback):
            assert pool["spec"]["template"]["metadata"]["labels"] == {POOL_LABEL: group}
            assert _requirements(pool)["node.kubernetes.io/instance-type"] == types
        # Karpenter tries the higher weight first: Spot, and on demand only when no Spot node can be had.
        assert _requirements(spot)["karpenter.sh/capacity-type"] == ["spot"] and spot["spec"]["weight"] == 100
        assert _requirements(fallback)["karpenter.sh/capacity-type"] == ["on-demand"]
        assert fallback["spec"]["weight"] == 10
        assert spot["spec"]["limits"][GPU_RESOURCE] == "16" and fallback["spec"]["limits"][GPU_RESOURCE] == "8"


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
    estimate = stack_estimate("large-70b", plan_for("large-70b"))
    (workers,) = [item for item in estimate.items if item.item.startswith("gpu workers: 2 x g5.48xlarge spot")]
    assert workers.unit_price == PRICES.instance("us-west-2", "g5.48xlarge").spot_hourly
    ceilings = {c.pool: c for c in estimate.ceilings}
    p4d = PRICES.instance("us-west-2", "p4d.24xlarge")
    g5 = PRICES.instance("us-west-2", "g5.2xlarge")
    assert ceilings["gpu8-on-demand"].hourly_usd == pytest.approx(8 * p4d.on_demand_hourly / 8)
    assert ceilings["gpu8-spot"].hourly_usd == pytest.approx(16 * p4d.spot_hourly / 8)
    assert ceilings["gpu-on-demand"].hourly_usd == pytest.approx(8 * g5.on_demand_hourly)
    worst = 16 * g5.spot_hourly + 8 * g5.on_demand_hourly + 2 * p4d.spot_hourly + p4d.on_demand_hourly
    assert estimate.worst_case_hourly_usd == pytest.approx(worst, abs=0.01)
    assert f"at its nvidia.com/gpu limit: {worst:,.2f} USD" in format_estimate(estimate)
