"""What a stack runs, as the estimate and the preflight see it: derived from the stack config alone.

Node counts, instance types and nightly hours come from the config (`small.*`, `eks.*`, `cost.nightly_hours`);
the monthly volumes (storage, traffic, logs) are assumptions per tier, listed in `TIER_USAGE` and printed with
every estimate. Counts of alarms and dashboards are read from the plan when one is at hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from infra.config import StackConfig
from infra.estimate import (
    HOURS_PER_MONTH,
    Estimate,
    EstimateInputs,
    FixedParts,
    NodePool,
    Usage,
    estimate,
    nightly_hours_per_month,
)
from infra.pricing.table import load_prices

# Assumed monthly volumes per tier: a tier's batch size sets its data, traffic and logs. Not measured.
TIER_USAGE: dict[str, Usage] = {
    "small": Usage(s3_standard_gb=50, s3_glacier_gb=200, nat_gb=20, endpoint_gb=0, log_gb=2, ecr_gb=15),
    "medium": Usage(s3_standard_gb=300, s3_glacier_gb=1500, nat_gb=50, endpoint_gb=50, log_gb=10, ecr_gb=30),
    "large": Usage(
        s3_standard_gb=2000, s3_glacier_gb=10000, nat_gb=200, endpoint_gb=300, log_gb=50, ecr_gb=60
    ),
}
# EKS nodes' root volumes (the managed node groups' default size).
EKS_NODE_VOLUME_GB = 100


def node_pools(config: StackConfig) -> tuple[tuple[NodePool, ...], tuple[NodePool, ...]]:
    """(nightly pools, always-on pools) at their largest: every GPU node for the whole nightly window."""
    nightly_hours = nightly_hours_per_month(config.cost.nightly_hours)
    if config.tier == "small":
        gpu = NodePool(
            name="gpu node",
            instance_type=config.small.instance_type,
            count=1,
            hours_per_month=nightly_hours,
            capacity="spot",
            root_volume_gb=config.small.root_volume_gib,
        )
        return (gpu,), ()
    workers = NodePool(
        name="gpu workers",
        instance_type=config.eks.gpu_instance_type,
        count=config.eks.gpu_max_nodes,
        hours_per_month=nightly_hours,
        capacity="spot",
        root_volume_gb=EKS_NODE_VOLUME_GB,
    )
    # The on-demand head node also hosts the operators (KubeRay, Karpenter): it runs all month.
    head = NodePool(
        name="head node",
        instance_type=config.eks.head_instance_type,
        count=1,
        hours_per_month=HOURS_PER_MONTH,
        capacity="on-demand",
        root_volume_gb=EKS_NODE_VOLUME_GB,
    )
    return (workers,), (head,)


def _count(plan: Iterable[dict[str, Any]] | None, typ: str) -> int:
    return 0 if plan is None else sum(1 for item in plan if item.get("type") == typ)


def estimate_inputs(
    stack: str, config: StackConfig, plan: Iterable[dict[str, Any]] | None = None
) -> EstimateInputs:
    plan = list(plan) if plan is not None else None
    network = config.network
    nightly, always_on = node_pools(config)
    nat_gateways = 0
    if network.create_vpc:
        nat_gateways = 1 if network.single_nat_gateway else network.az_count
    fixed = FixedParts(
        eks_clusters=0 if config.tier == "small" else 1,
        nat_gateways=nat_gateways,
        interface_endpoints=len(network.interface_endpoints),
        endpoint_azs=network.az_count,
        always_on_nodes=always_on,
        kms_keys=max(1, _count(plan, "aws:kms/key:Key")),
        alarms=_count(plan, "aws:cloudwatch/metricAlarm:MetricAlarm"),
        dashboards=_count(plan, "aws:cloudwatch/dashboard:Dashboard"),
    )
    return EstimateInputs(
        stack=stack, region=config.region, nightly_pools=nightly, fixed=fixed, usage=TIER_USAGE[config.tier]
    )


def capacity_pools(config: StackConfig) -> tuple[NodePool, ...]:
    """Every pool the stack may run at once, for the quota check."""
    nightly, always_on = node_pools(config)
    return nightly + always_on


def offline_config(stack: str) -> StackConfig:
    """The stack's validated config read from stacks/Pulumi.<stack>.yaml, as the program would see it."""
    from infra.config import decode_pulumi_values, load_stack_config
    from infra.plan import read_stack_config

    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def stack_estimate(stack: str, plan: Iterable[dict[str, Any]] | None = None) -> Estimate:
    """The stack's monthly estimate at the repo's prices."""
    return estimate(estimate_inputs(stack, offline_config(stack), plan), load_prices())
