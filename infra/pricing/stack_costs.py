"""What a stack runs, as the estimate and the preflight see it: derived from the stack config alone.

Node counts, instance types and nightly hours come from the config (`small.*`, `eks.*`, `cost.nightly_hours`);
the monthly volumes (storage, traffic, logs) are assumptions per tier, listed in `TIER_USAGE` and printed with
every estimate. Counts of alarms and dashboards are read from the plan when one is at hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from infra import facts
from infra.k8s.common import quantity_value
from infra.k8s.head_group import SYSTEM_NODES, head_group_shortfall, pods_on_head_group
from infra.k8s.instance_types import NODE_MEMORY_SHARE, NODE_RESERVED_CPU, shape_of
from infra.k8s.rayservice import workers_for
from infra.pricing.estimate import (
    HOURS_PER_MONTH,
    Capacity,
    EstimateInputs,
    FixedParts,
    NodePool,
    PoolCeiling,
    Usage,
    nightly_hours_per_month,
)
from infra.pricing.table import PriceTable, PriceTableError, load_prices

if TYPE_CHECKING:
    # Types only: the config model prices nothing, so nothing here is imported by it.
    from infra.config import StackConfig

# Assumed monthly volumes per tier: a tier's batch size sets its data, traffic and logs. Not measured.
TIER_USAGE: dict[str, Usage] = {
    "small": Usage(s3_standard_gb=50, s3_glacier_gb=200, nat_gb=20, endpoint_gb=0, log_gb=2, ecr_gb=15),
    "medium": Usage(s3_standard_gb=300, s3_glacier_gb=1500, nat_gb=50, endpoint_gb=50, log_gb=10, ecr_gb=30),
    "large": Usage(s3_standard_gb=2000, s3_glacier_gb=10000, nat_gb=200, endpoint_gb=300, log_gb=50, ecr_gb=60),
}


def karpenter_choice(config: StackConfig, prices: PriceTable) -> tuple[str, int]:
    """(instance type, nodes) for the night's Ray workers, the cheapest at Spot prices.

    The night's worker group (`StackConfig.night_workers`: one-GPU or eight-GPU workers, as the model needs)
    at its most workers. Karpenter launches the cheapest type of its NodePool that fits the pending pods (Spot's
    price-capacity-optimized strategy may pick a slightly dearer pool with more capacity). Kubelet's reserve is
    the one the config model checks fits with (infra/config/eks.py).
    """
    group = config.night_workers
    worker = group.size
    cpus = quantity_value(worker.cpu)
    memory_gib = quantity_value(worker.memory) / 2**30
    gpus = max(worker.gpus, 1)
    choices = []
    for instance_type in group.node_pool.instance_types:
        price = prices.instance(config.region, instance_type)
        shape = shape_of(instance_type)
        per_node = min(
            shape.gpus // gpus,
            int((shape.vcpus - NODE_RESERVED_CPU) // cpus),
            int(shape.memory_gib * NODE_MEMORY_SHARE // memory_gib),
        )
        if per_node < 1:
            continue
        nodes = math.ceil(group.max_nodes / per_node)
        choices.append((nodes * price.spot_hourly, instance_type, nodes))
    if not choices:
        raise ValueError(
            f"no type in {group.key} {group.node_pool.instance_types} fits a worker "
            f"of {worker.cpu} CPU / {worker.memory} / {gpus} GPU"
        )
    _, instance_type, nodes = min(choices)
    return instance_type, nodes


def pool_ceilings(config: StackConfig, prices: PriceTable) -> tuple[PoolCeiling, ...]:
    """Karpenter's GPU NodePools of the night (both worker groups, Spot and on-demand fallback) at their GPU
    limits: what the stack can cost an hour at worst, whatever a night asks for (a bug, a stuck pod)."""
    if config.tier == "small" or not config.eks.karpenter_enabled:
        return ()
    eks = config.eks
    groups = [eks.node_pool, *([eks.eight_gpu.node_pool] if eks.eight_gpu.enabled else [])]
    ceilings = []
    for pool in (each for group in groups for each in group.spot_and_fallback()):
        capacity: Capacity = "spot" if pool.spot else "on-demand"
        per_gpu = []
        for instance_type in pool.instance_types:
            price = prices.instance(config.region, instance_type)
            hourly = price.spot_hourly if capacity == "spot" else price.on_demand_hourly
            per_gpu.append((hourly / shape_of(instance_type).gpus, instance_type))
        rate, dearest = max(per_gpu)
        ceilings.append(
            PoolCeiling(
                pool=pool.name, capacity=capacity, gpu_limit=pool.gpu_limit, dearest_type=dearest, usd_per_gpu_hour=rate
            )
        )
    return tuple(ceilings)


# The NAT instance's root volume: the size of the Amazon Linux 2023 image's snapshot.
NAT_INSTANCE_VOLUME_GB = 8


def gpu_pools(config: StackConfig, prices: PriceTable) -> tuple[NodePool, ...]:
    """The GPU nodes a night runs, at their largest: every GPU node for the whole nightly window."""
    nightly_hours = nightly_hours_per_month(config.cost.nightly_hours)
    boot_hours = nightly_hours_per_month(config.cost.boot_minutes / 60)
    if config.tier == "small":
        gpu = NodePool(
            name="gpu node",
            instance_type=config.small.instance_type,
            count=1,
            hours_per_month=nightly_hours,
            capacity="spot",
            root_volume_gb=config.small.root_volume_gib,
            boot_hours_per_month=boot_hours,
            # In a public subnet the node has its own address (billed while it runs) instead of a NAT.
            public_ipv4=config.network.egress == "public_subnets" and config.network.create_vpc,
        )
        return (gpu,)
    eks = config.eks
    if eks.karpenter_enabled:
        worker_type, worker_nodes = karpenter_choice(config, prices)
    else:
        worker_type, worker_nodes = eks.gpu_instance_type, eks.gpu_max_nodes
    workers = NodePool(
        name="gpu workers",
        instance_type=worker_type,
        count=worker_nodes,
        hours_per_month=nightly_hours,
        capacity="spot",
        root_volume_gb=eks.node_volume_gib,
        boot_hours_per_month=boot_hours,
    )
    return (workers,)


def head_pool(config: StackConfig, hours_per_month: float, boot_hours: float = 0) -> NodePool:
    """The on-demand Ray head node(s), for `hours_per_month`: as many as the Ray heads that share them need."""
    eks = config.eks
    heads = [*eks.ray_heads, *(config.serve.ray_heads if config.serve.enabled else [])]
    pods = pods_on_head_group(heads)
    shape = shape_of(eks.head_instance_type)
    count = next(
        (n for n in range(1, eks.head_nodes + 1) if head_group_shortfall(pods, shape, n) is None), eks.head_nodes
    )
    return NodePool(
        name="ray head node",
        instance_type=eks.head_instance_type,
        count=count,
        hours_per_month=hours_per_month,
        capacity="on-demand",
        root_volume_gb=eks.node_volume_gib,
        boot_hours_per_month=boot_hours,
    )


def node_pools(config: StackConfig, prices: PriceTable) -> tuple[tuple[NodePool, ...], tuple[NodePool, ...]]:
    """(nightly pools, always-on pools): a night's GPU nodes and (EKS) its Ray head node, which scales from 0
    for the run; all month, the EKS system node that holds the operators and CoreDNS. With the online endpoint
    on, its RayService keeps a head node all month: that node is in `serve_pools`, and the night's head shares it."""
    gpus = gpu_pools(config, prices)
    if config.tier == "small":
        return gpus, ()
    eks = config.eks
    system = NodePool(
        name="system node",
        instance_type=eks.system_instance_type,
        count=SYSTEM_NODES,
        hours_per_month=HOURS_PER_MONTH,
        capacity="on-demand",
        root_volume_gb=eks.system_volume_gib,
    )
    if config.serve.enabled:
        return gpus, (system,)
    nightly_hours = nightly_hours_per_month(config.cost.nightly_hours)
    boot_hours = nightly_hours_per_month(config.cost.boot_minutes / 60)
    return (*gpus, head_pool(config, nightly_hours, boot_hours)), (system,)


def nat_instances(config: StackConfig) -> tuple[NodePool, ...]:
    """The NAT instances (egress: nat_instance) at their on-demand price all month, each with its public IPv4."""
    network = config.network
    if network.egress != "nat_instance" or not network.nat_count:
        return ()
    return (
        NodePool(
            name="NAT instance",
            instance_type=network.nat_instance_type,
            count=network.nat_count,
            hours_per_month=HOURS_PER_MONTH,
            capacity="on-demand",
            root_volume_gb=NAT_INSTANCE_VOLUME_GB,
            public_ipv4=True,
        ),
    )


def serve_pools(config: StackConfig) -> tuple[NodePool, ...]:
    """The online endpoint's GPU nodes (`serve.*`; none while it is off): `serve.max_replicas` worth of nodes for
    `serve.busy_hours_per_day`, `serve.min_replicas` worth the rest of the day. An upper bound for the busy hours,
    as the nightly pool's is: Serve scales replicas to the load and may not reach the maximum."""
    serve = config.serve
    if config.tier == "small" or not serve.enabled:
        return ()
    per_node = max(1, shape_of(serve.instance_type).gpus // serve.worker_size.gpus)
    tp = config.serve_config().engine.tensor_parallel_size
    busy_nodes = math.ceil(workers_for(serve.max_replicas, serve.worker_size.gpus, tp) / per_node)
    idle_nodes = math.ceil(workers_for(serve.min_replicas, serve.worker_size.gpus, tp) / per_node)
    busy_hours = nightly_hours_per_month(serve.busy_hours_per_day)
    # The RayService's head keeps a head node all month (the nightly head shares it).
    pools = [
        head_pool(config, HOURS_PER_MONTH).model_copy(update={"name": "endpoint's ray head node"}),
        NodePool(
            name="endpoint replicas, busy hours",
            instance_type=serve.instance_type,
            count=busy_nodes,
            hours_per_month=busy_hours,
            capacity=serve.capacity_type,
            root_volume_gb=config.eks.node_volume_gib,
        ),
    ]
    if idle_nodes and serve.busy_hours_per_day < 24:
        pools.append(
            NodePool(
                name="endpoint replicas, idle floor",
                instance_type=serve.instance_type,
                count=idle_nodes,
                hours_per_month=HOURS_PER_MONTH - busy_hours,
                capacity=serve.capacity_type,
                root_volume_gb=config.eks.node_volume_gib,
            )
        )
    return tuple(pools)


def run_hourly_usd(config: StackConfig, prices: PriceTable) -> float:
    """USD an hour for the GPU nodes one run uses, at the table's Spot prices: what the job prices its tokens at.

    Small: its one node. Medium: every node of the fixed GPU group (the cluster holds them all for the run).
    Large: the cheapest NodePool type that fits the workers, times the nodes `eks.gpu_max_nodes` workers need:
    an upper bound as a rule, since Ray autoscales from `eks.gpu_min_workers` and a short run may never reach
    the maximum (though Karpenter may launch a dearer type when the cheapest is short of Spot capacity). The
    on-demand head node is left out: the GPUs decode the tokens; the estimate shows the head a night apart.
    """
    return round(
        sum(
            pool.count * prices.instance(config.region, pool.instance_type).spot_hourly
            for pool in gpu_pools(config, prices)
        ),
        4,
    )


def _count(plan: Iterable[dict[str, Any]] | None, typ: str) -> int:
    return 0 if plan is None else sum(1 for item in plan if item.get("type") == typ)


def estimate_inputs(
    stack: str,
    config: StackConfig,
    prices: PriceTable,
    plan: Iterable[dict[str, Any]] | None = None,
    on: date | None = None,
    assume_free_tier: bool = True,
) -> EstimateInputs:
    """The estimate's inputs for the month from `on` (default: today, UTC): a cluster whose version is in
    extended support for some of that month is billed it for those hours (infra/facts/eks_versions.json).
    `assume_free_tier`: the account's free alarms and dashboards are this stack's (infra/pricing/idle_cost.py)."""
    from infra.pricing.idle_cost import free_tier

    free = free_tier(assume_free_tier)
    plan = list(plan) if plan is not None else None
    on = on or datetime.now(UTC).date()
    clusters = 0 if config.tier == "small" else 1
    network = config.network
    nightly, always_on = node_pools(config, prices)
    fixed = FixedParts(
        eks_clusters=clusters,
        kubernetes_version=None if clusters == 0 else config.eks.version,
        eks_extended_support_hours=clusters
        and clusters * facts.extended_support_hours(config.eks.version, on, HOURS_PER_MONTH),
        nat_gateways=network.nat_count if network.egress == "nat_gateway" else 0,
        nat_instances=nat_instances(config),
        interface_endpoints=len(network.interface_endpoints),
        endpoint_azs=network.subnet_count,
        always_on_nodes=always_on,
        kms_keys=max(1, _count(plan, "aws:kms/key:Key")),
        alarms=_count(plan, "aws:cloudwatch/metricAlarm:MetricAlarm"),
        dashboards=_count(plan, "aws:cloudwatch/dashboard:Dashboard"),
        free_alarms=free.cloudwatch_alarms,
        free_dashboards=free.cloudwatch_dashboards,
    )
    return EstimateInputs(
        stack=stack,
        region=config.region,
        nightly_pools=nightly,
        ceilings=pool_ceilings(config, prices),
        serve_pools=serve_pools(config),
        fixed=fixed,
        usage=TIER_USAGE[config.tier],
    )


def capacity_pools(config: StackConfig, prices: PriceTable) -> tuple[tuple[NodePool, ...], tuple[NodePool, ...]]:
    """(pools the stack runs at once, other pools it may fall back to) for the quota check.

    Karpenter may launch any type of its NodePool (and on demand, with the fallback on) when the cheapest
    Spot type runs short: one node of each is the least its quota must allow for that to work.
    """
    nightly, always_on = node_pools(config, prices)
    if config.tier == "small":
        # Capacity rebalancing launches the replacement beside the node it replaces, and terminates the old one
        # only once the new one runs: for that while the G and VT Spot quota holds two nodes.
        (node,) = nightly
        return (node.model_copy(update={"count": 2, "name": "gpu node and its rebalancing replacement"}),), ()
    # The endpoint's busiest hour may fall in the nightly window: the quota must hold both at their largest (its
    # head node and its busy-hours replicas, the first two of `serve_pools`).
    required = nightly + always_on + serve_pools(config)[:2]
    if not config.eks.karpenter_enabled:
        return required, ()
    pool = config.night_workers.node_pool
    capacities: tuple[Capacity, ...] = ("spot", "on-demand") if pool.on_demand_fallback else ("spot",)
    chosen = {(p.instance_type, p.capacity) for p in gpu_pools(config, prices)}
    fallback = tuple(
        NodePool(name="karpenter fallback", instance_type=t, count=1, hours_per_month=0, capacity=c)
        for t in pool.instance_types
        for c in capacities
        if (t, c) not in chosen
    )
    return required, fallback


def run_price_per_hour_usd(config: StackConfig) -> float | None:
    """The run's GPU nodes at the repo's Spot prices (infra/pricing), for the job's cost per token.

    None where the table has no price for the region or an instance type: the job then reports no cost
    (and the program warns) rather than a deploy failing over a metric; `python -m infra.pricing.refresh`
    or `job.job_overrides.metrics.price_per_hour_usd` fills the gap.
    """
    try:
        return run_hourly_usd(config, load_prices())
    except PriceTableError:
        return None


def price_warning(config: StackConfig) -> str | None:
    """Why the deployed job will report no cost, or None when it will (its own price or the table's)."""
    if "price_per_hour_usd" in config.job.job_overrides.get("metrics", {}):
        return None
    if run_price_per_hour_usd(config) is not None:
        return None
    return (
        f"the price table (infra/pricing/prices.json) has no Spot price for this stack's GPU instance type(s) "
        f"in {config.region}: the job will publish no CostPerMillionOutputTokens and no cost_usd. Run "
        f"`python -m infra.pricing.refresh --region {config.region}` or set "
        "llm-batch:job.job_overrides.metrics.price_per_hour_usd"
    )
