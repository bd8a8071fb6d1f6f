"""The price every deployed job puts on its tokens: the run's GPU nodes at the repo's Spot prices.

The job publishes CostPerMillionOutputTokens and writes `cost_usd` only when `metrics.price_per_hour_usd` is
above zero, so every stack's rendered job config must carry it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from infra.config import load_stack_config
from infra.eks_job import base_rayjob_args, manifests_for_date
from infra.k8s.rayjob import CONFIG_FILE, RayJobArgs
from infra.ops.stacks import offline_config
from infra.pricing.stack_costs import price_warning, run_hourly_usd, run_price_per_hour_usd
from infra.pricing.table import DEFAULT_TABLE, load_prices
from tests.infra.conftest import STACKS
from workload.job.summary import build_summary
from workload.telemetry.cloudwatch import cost_per_million_output_tokens

# What each shipped stack runs at most at once, worked out by hand from its stack file and the tier defaults:
# small one g5.xlarge; medium two g5.2xlarge (eks.gpu_max_nodes); large eight workers of 3 CPU / 12 GiB / 1 GPU,
# one per g5.xlarge, its NodePool's cheapest type that fits one (an upper bound: Ray starts it at one worker).
# The model stacks run two eight-GPU workers, one a node, on the cheaper eight-GPU type at Spot (g5.48xlarge).
RUN_NODES = {
    "small": ("g5.xlarge", 1),
    "medium": ("g5.2xlarge", 2),
    "large": ("g5.xlarge", 8),
    "large-70b": ("g5.48xlarge", 2),
    "large-moe": ("g5.48xlarge", 2),
}


def _spot(region: str, instance_type: str) -> float:
    table = json.loads(DEFAULT_TABLE.read_text())
    return float(table["regions"][region]["ec2"][instance_type]["spot_hourly"])


def _job(stack: str, **overrides: Any) -> Any:
    config = offline_config(stack)
    if overrides:
        data = config.model_dump(mode="json")
        data["job"]["job_overrides"] = overrides
        config = type(config).model_validate(data)
    # As the program builds it (infra/__main__.py, infra/eks_job.py): priced from the table.
    return config.job_config(
        "s3://bucket/input/{date}/",
        "s3://bucket/output/{date}/",
        stack=stack,
        price_per_hour_usd=run_price_per_hour_usd(config),
    )


def test_every_shipped_stack_is_priced() -> None:
    assert sorted(RUN_NODES) == STACKS


@pytest.mark.parametrize("stack", sorted(RUN_NODES))
def test_job_config_prices_the_runs_gpu_nodes_at_spot(stack: str) -> None:
    config = offline_config(stack)
    instance_type, nodes = RUN_NODES[stack]
    if stack == "small":
        assert config.small.instance_type == instance_type
    elif stack == "medium":
        assert (config.eks.gpu_instance_type, config.eks.gpu_max_nodes) == (instance_type, nodes)
    else:
        group = config.night_workers
        assert group.max_nodes == nodes and instance_type in group.node_pool.instance_types
    expected = nodes * _spot(config.region, instance_type)
    price = _job(stack).metrics.price_per_hour_usd
    assert price == pytest.approx(expected) and price > 0
    assert run_hourly_usd(config, load_prices()) == pytest.approx(expected)


@pytest.mark.parametrize("stack", sorted(RUN_NODES))
def test_a_priced_run_reports_its_cost(stack: str) -> None:
    """With the stack's price, an hour's run of a million tokens costs exactly the hourly price."""
    job = _job(stack)
    cost = cost_per_million_output_tokens(job.metrics.price_per_hour_usd, 3600.0, 1_000_000)
    assert cost == pytest.approx(job.metrics.price_per_hour_usd)
    manifest = {
        "attempts": [{"wall_s": 1800.0, "started_at": "2026-11-29T02:00:00Z"}],
        "rows_in": 0,
        "config_hash": "x",
    }
    summary = build_summary(job, manifest, {})
    assert summary["cost_usd"] == pytest.approx(job.metrics.price_per_hour_usd / 2, abs=1e-4)


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_the_plans_rayjob_carries_the_price(plan_for: Any, stack: str) -> None:
    """What the nightly run submits: the `rayjob_args` export, rendered into the ConfigMap the head reads."""
    (exports,) = [item["outputs"] for item in plan_for(stack) if item["type"] == "pulumi:pulumi:Stack"]
    args = RayJobArgs.model_validate_json(exports["rayjob_args"])
    expected = _job(stack).metrics.price_per_hour_usd
    assert args.job.metrics.price_per_hour_usd == expected > 0
    (config_map,) = [m for m in manifests_for_date(args, "2026-11-29") if m["kind"] == "ConfigMap"]
    assert yaml.safe_load(config_map["data"][CONFIG_FILE])["metrics"]["price_per_hour_usd"] == expected
    # Fitting the job to the workers keeps it too.
    rebuilt = base_rayjob_args(offline_config(stack), stack, args.image, "bucket")
    assert rebuilt.job.metrics.price_per_hour_usd == expected


def test_a_stacks_own_price_wins() -> None:
    assert _job("medium", metrics={"price_per_hour_usd": 1.5}).metrics.price_per_hour_usd == 1.5
    # An explicit 0 turns the cost metric off.
    assert _job("small", metrics={"price_per_hour_usd": 0}).metrics.price_per_hour_usd == 0


def test_a_region_without_prices_leaves_the_cost_off_and_says_why() -> None:
    """A deploy never fails over the metric; the program warns with this message (infra/__main__.py)."""
    config = load_stack_config("small", {"cost_center": "x", "region": "ap-south-2"})
    assert run_price_per_hour_usd(config) is None
    price = run_price_per_hour_usd(config)
    assert (
        config.job_config("s3://b/i/", "s3://b/o/", stack="small", price_per_hour_usd=price).metrics.price_per_hour_usd
        == 0
    )
    warning = price_warning(config)
    assert warning is not None and "ap-south-2" in warning and "price_per_hour_usd" in warning
    # The stack's own price needs no table, and silences the warning.
    data = config.model_dump(mode="json")
    data["job"]["job_overrides"] = {"metrics": {"price_per_hour_usd": 0.5}}
    priced = type(config).model_validate(data)
    assert priced.job_config("s3://b/i/", "s3://b/o/").metrics.price_per_hour_usd == 0.5
    assert price_warning(priced) is None
    for stack in RUN_NODES:
        assert price_warning(offline_config(stack)) is None
