"""A stack's monthly cost before anything is deployed: pure arithmetic from stack inputs and the price table.

Every figure is a line item (what, how many, unit price, dollars a month): a reader can check the sum by hand.
AWS bills by the hour; a month here is 730 hours (8,760 / 12), and a nightly pool runs `hours_per_night` on
730 / 24 nights.

Two figures answer "what does it cost when nothing runs?" and "what does a night add?": `idle_monthly_usd`, the
`fixed` group (what the plan's resources bill in a month with no run at all), and `per_night_usd`, the `compute`
group over the month's nights (every node a night starts, its boot, image pull and model fetch included).
Storage and monitoring scale with the data kept and the alarms defined and are shown apart; optional components
(the online endpoint, later the Batch API) add their own groups through `optional_items`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from infra.pricing.table import PriceTable

HOURS_PER_MONTH = 730.0
NIGHTS_PER_MONTH = HOURS_PER_MONTH / 24

Capacity = Literal["spot", "on-demand"]


class NodePool(BaseModel):
    """Instances of one type that run together: the small tier's node, an EKS head group, GPU workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    instance_type: str
    count: float = Field(ge=0, description="Instances running while the pool runs (an average for autoscaling)")
    hours_per_month: float = Field(ge=0, le=HOURS_PER_MONTH, description="Hours a month the pool runs")
    capacity: Capacity
    root_volume_gb: int = Field(default=100, ge=0, description="gp3 root volume per instance while it exists")
    boot_hours_per_month: float = Field(
        default=0, ge=0, description="Hours a month each instance runs before it works: boot, image pull, model fetch"
    )
    public_ipv4: bool = Field(default=False, description="Each instance has a public IPv4 address while it runs")


class FixedParts(BaseModel):
    """What runs all month whatever the job does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eks_clusters: int = Field(default=0, ge=0)
    kubernetes_version: str | None = Field(default=None, description="The clusters' version, for the line's name")
    eks_extended_support_hours: float = Field(
        default=0, ge=0, description="Cluster-hours of the month the clusters' version is in extended support"
    )
    nat_gateways: int = Field(default=0, ge=0)
    nat_instances: tuple[NodePool, ...] = Field(
        default=(), description="NAT instances: all month, each with its public IPv4 (no per-GB processing fee)"
    )
    interface_endpoints: int = Field(default=0, ge=0, description="Interface VPC endpoints (ECR, STS, logs...)")
    endpoint_azs: int = Field(default=0, ge=0, description="AZs each interface endpoint has a network interface in")
    always_on_nodes: tuple[NodePool, ...] = ()
    kms_keys: int = Field(default=1, ge=0)
    alarms: int = Field(default=0, ge=0, description="Standard-resolution metric alarms")
    dashboards: int = Field(default=0, ge=0)
    # The account's free tier, where the estimate assumes this stack has it to itself (infra/facts/idle_prices.json):
    # the first alarms and dashboards of an account bill nothing.
    free_alarms: int = Field(default=0, ge=0, description="Alarms the account's free tier covers")
    free_dashboards: int = Field(default=0, ge=0, description="Dashboards the account's free tier covers")


class Usage(BaseModel):
    """Assumed monthly volumes; printed with the estimate so nobody mistakes them for measurements."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    s3_standard_gb: float = Field(default=100, ge=0, description="Inputs and fresh results in S3 Standard")
    s3_glacier_gb: float = Field(default=500, ge=0, description="Older results moved to Glacier by lifecycle")
    nat_gb: float = Field(default=50, ge=0, description="Traffic through NAT (what no endpoint covers)")
    endpoint_gb: float = Field(default=200, ge=0, description="Traffic through interface endpoints (image pulls)")
    log_gb: float = Field(default=5, ge=0, description="CloudWatch Logs ingested")
    ecr_gb: float = Field(default=15, ge=0, description="Job images kept in ECR")


class PoolCeiling(BaseModel):
    """The most one Karpenter GPU NodePool can cost an hour: its `nvidia.com/gpu` limit at the dearest GPU-hour
    of its types and capacity type (no node costs more than its GPUs at that rate). Karpenter has no price
    field; these limits are what bound the dollars."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str
    capacity: Capacity
    gpu_limit: int = Field(ge=0)
    dearest_type: str
    usd_per_gpu_hour: float = Field(ge=0)

    @property
    def hourly_usd(self) -> float:
        return self.gpu_limit * self.usd_per_gpu_hour


class EstimateInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    region: str
    nightly_pools: tuple[NodePool, ...] = ()
    ceilings: tuple[PoolCeiling, ...] = Field(default=(), description="Karpenter's GPU pools at their limits")
    serve_pools: tuple[NodePool, ...] = Field(default=(), description="The online endpoint's GPU nodes (serve.*)")
    fixed: FixedParts = FixedParts()
    usage: Usage = Usage()


Group = Literal["compute", "serving", "fixed", "storage", "monitoring"]
# What each group means on the terminal; `fixed` is the idle month, `compute` what the month's nights add.
GROUP_TITLES: dict[str, str] = {
    "compute": "per night x {nights:.1f} nights (compute)",
    "serving": "online endpoint (serving)",
    "fixed": "idle: all month with no run (fixed)",
    "storage": "storage",
    "monitoring": "monitoring",
}


class LineItem(BaseModel):
    model_config = ConfigDict(frozen=True)

    group: Group
    item: str
    quantity: float
    unit: str
    unit_price: float
    free_quantity: float = Field(default=0, ge=0, description="Of `quantity`, what the account's free tier covers")
    monthly_usd: float


class Estimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    stack: str
    region: str
    prices_as_of: str
    prices_source: str
    items: tuple[LineItem, ...]
    usage: Usage
    ceilings: tuple[PoolCeiling, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worst_case_hourly_usd(self) -> float | None:
        """Every Karpenter GPU pool full to its GPU limit at once, for an hour (None: no Karpenter pools)."""
        return round(sum(c.hourly_usd for c in self.ceilings), 2) if self.ceilings else None

    @property
    def total(self) -> float:
        return sum(item.monthly_usd for item in self.items)

    def subtotal(self, group: str) -> float:
        return sum(item.monthly_usd for item in self.items if item.group == group)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def idle_monthly_usd(self) -> float:
        """What the stack's resources bill in a month with no run at all (the `fixed` group)."""
        return round(self.subtotal("fixed"), 2)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def per_night_usd(self) -> float:
        """What one night adds: its nodes' hours, boot included (the `compute` group over the month's nights)."""
        return round(self.subtotal("compute") / NIGHTS_PER_MONTH, 2)


def nightly_hours_per_month(hours_per_night: float) -> float:
    """Hours a month of a pool that runs `hours_per_night` every night."""
    if not 0 <= hours_per_night <= 24:
        raise ValueError(f"hours_per_night must be between 0 and 24, got {hours_per_night}")
    return hours_per_night * NIGHTS_PER_MONTH


def _item(group: str, item: str, quantity: float, unit: str, unit_price: float, free: float = 0) -> LineItem:
    """A line; `free` of the quantity is the free tier's, billed nothing (never more than the quantity)."""
    free = min(free, quantity)
    return LineItem.model_validate(
        {
            "group": group,
            "item": item,
            "quantity": quantity,
            "unit": unit,
            "unit_price": unit_price,
            "free_quantity": free,
            "monthly_usd": (quantity - free) * unit_price,
        }
    )


line_item = _item  # the public name other pricing modules build their lines with


def compute_items(pools: Iterable[NodePool], region: str, prices: PriceTable, group: str = "compute") -> list[LineItem]:
    """Instance-hours at the pool's capacity price, plus the gp3 root volumes while the instances exist."""
    gp3 = prices.region(region).services.ebs_gp3_gb_month
    items: list[LineItem] = []
    for pool in pools:
        price = prices.instance(region, pool.instance_type)
        hourly = price.spot_hourly if pool.capacity == "spot" else price.on_demand_hourly
        instance_hours = pool.count * pool.hours_per_month
        hours = f"{pool.hours_per_month:.0f} h"
        label = f"{pool.name}: {pool.count:g} x {pool.instance_type} {pool.capacity}, {hours}"
        items.append(_item(group, label, instance_hours, "instance-hour", hourly))
        if pool.boot_hours_per_month:
            boot = pool.count * pool.boot_hours_per_month
            label = f"{pool.name}: boot, image pull, model fetch, {pool.boot_hours_per_month:.0f} h"
            items.append(_item(group, label, boot, "instance-hour", hourly))
        running = pool.hours_per_month + pool.boot_hours_per_month
        if pool.root_volume_gb:
            # A volume lives as long as its instance: GB-months scale with the share of the month it runs.
            gb_months = pool.count * pool.root_volume_gb * running / HOURS_PER_MONTH
            items.append(_item(group, f"{pool.name}: gp3 root volumes", gb_months, "GB-month", gp3))
        if pool.public_ipv4:
            ipv4 = prices.region(region).services.public_ipv4_hourly
            items.append(
                _item(group, f"{pool.name}: public IPv4 while it runs", pool.count * running, "address-hour", ipv4)
            )
    return items


def fixed_items(fixed: FixedParts, usage: Usage, region: str, prices: PriceTable) -> list[LineItem]:
    svc = prices.region(region).services
    items: list[LineItem] = []
    if fixed.eks_clusters:
        hours = fixed.eks_clusters * HOURS_PER_MONTH
        items.append(_item("fixed", "EKS control plane", hours, "cluster-hour", svc.eks_control_plane_hourly))
    if fixed.eks_extended_support_hours:
        # Past standard support EKS bills extended support on top of the control plane (infra/facts).
        label = f"EKS extended support (Kubernetes {fixed.kubernetes_version})"
        hours = fixed.eks_extended_support_hours
        items.append(_item("fixed", label, hours, "cluster-hour", svc.eks_extended_support_hourly))
    if fixed.nat_gateways:
        hours = fixed.nat_gateways * HOURS_PER_MONTH
        items.append(_item("fixed", "NAT gateway", hours, "gateway-hour", svc.nat_gateway_hourly))
        items.append(_item("fixed", "NAT gateway public IPv4", hours, "address-hour", svc.public_ipv4_hourly))
        items.append(_item("fixed", "NAT data processed", usage.nat_gb, "GB", svc.nat_gateway_per_gb))
    # A NAT instance bills its hours, address and volume; traffic through it has no processing fee.
    items.extend(compute_items(fixed.nat_instances, region, prices, group="fixed"))
    if fixed.interface_endpoints:
        az_hours = fixed.interface_endpoints * max(fixed.endpoint_azs, 1) * HOURS_PER_MONTH
        items.append(
            _item(
                "fixed",
                "interface VPC endpoints",
                az_hours,
                "endpoint-AZ-hour",
                svc.interface_endpoint_hourly_per_az,
            )
        )
        items.append(_item("fixed", "endpoint data processed", usage.endpoint_gb, "GB", svc.interface_endpoint_per_gb))
    # Always-on nodes (the EKS system node) bill all month whatever the job does: a fixed cost.
    items.extend(compute_items(fixed.always_on_nodes, region, prices, group="fixed"))
    if fixed.kms_keys:
        items.append(_item("fixed", "KMS keys", fixed.kms_keys, "key-month", svc.kms_key_month))
    # Alarms and dashboards bill every month whether or not a night runs: idle, not monitoring volume.
    if fixed.alarms:
        alarm = svc.cloudwatch_alarm_month
        items.append(_item("fixed", "CloudWatch alarms", fixed.alarms, "alarm-month", alarm, fixed.free_alarms))
    if fixed.dashboards:
        dashboard = svc.cloudwatch_dashboard_month
        free = fixed.free_dashboards
        items.append(_item("fixed", "CloudWatch dashboards", fixed.dashboards, "dashboard-month", dashboard, free))
    return items


def storage_items(usage: Usage, region: str, prices: PriceTable) -> list[LineItem]:
    svc = prices.region(region).services
    return [
        _item("storage", "S3 Standard", usage.s3_standard_gb, "GB-month", svc.s3_standard_gb_month),
        _item(
            "storage",
            "S3 Glacier Flexible Retrieval",
            usage.s3_glacier_gb,
            "GB-month",
            svc.s3_glacier_flexible_gb_month,
        ),
        _item("storage", "ECR images", usage.ecr_gb, "GB-month", svc.ecr_storage_gb_month),
    ]


def monitoring_items(usage: Usage, region: str, prices: PriceTable) -> list[LineItem]:
    """What the month's logs cost: a volume that grows with the runs (alarms and dashboards are in `fixed`)."""
    svc = prices.region(region).services
    return [_item("monitoring", "CloudWatch Logs ingestion", usage.log_gb, "GB", svc.cloudwatch_logs_ingest_per_gb)]


def optional_items(inputs: EstimateInputs, prices: PriceTable) -> list[LineItem]:
    """Lines of components a stack turns on, each in its own group, outside the idle and per-night figures:
    the online endpoint (`serve.*`) today; another optional component adds its lines here."""
    return compute_items(inputs.serve_pools, inputs.region, prices, group="serving")


def estimate(inputs: EstimateInputs, prices: PriceTable) -> Estimate:
    """Every line item of the stack's month from its inputs. What the stack's services bill besides (secrets,
    Step Functions transitions, the Batch API's lines) is added by `infra.ops.stacks.stack_estimate`."""
    items = [
        *compute_items(inputs.nightly_pools, inputs.region, prices),
        *optional_items(inputs, prices),
        *fixed_items(inputs.fixed, inputs.usage, inputs.region, prices),
        *storage_items(inputs.usage, inputs.region, prices),
        *monitoring_items(inputs.usage, inputs.region, prices),
    ]
    as_of, source = prices.dated_source(inputs.region)
    return Estimate(
        stack=inputs.stack,
        region=inputs.region,
        prices_as_of=as_of,
        prices_source=source,
        items=tuple(items),
        usage=inputs.usage,
        ceilings=inputs.ceilings,
    )


def price_text(value: float) -> str:
    """A unit price as a price list writes it: cents at least, no float noise (1.00, 0.0042, 0.000025)."""
    text = f"{value:.10f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{int(whole):,}.{cents.ljust(2, '0')}"


def format_estimate(result: Estimate) -> str:
    """The human summary `python -m infra.plan` prints: one line per item, subtotals, the total."""
    width = 60
    lines = [f"Monthly cost estimate for stack {result.stack} ({result.region}), prices of {result.prices_as_of}:"]
    for group, title in GROUP_TITLES.items():
        group_items = [item for item in result.items if item.group == group]
        if not group_items:
            continue
        lines.append(f"  {title.format(nights=NIGHTS_PER_MONTH)}: {result.subtotal(group):,.2f} USD")
        for item in group_items:
            free = f" ({item.free_quantity:,.0f} free)" if item.free_quantity else ""
            detail = f"{item.quantity:,.1f} {item.unit}{free} x {price_text(item.unit_price)}"
            lines.append(f"    {item.item[:width]:<{width}} {detail:>40} = {item.monthly_usd:>10,.2f}")
    lines.append(f"  total: {result.total:,.2f} USD a month")
    lines.append(
        f"  idle month (no run): {result.idle_monthly_usd:,.2f} USD; a night adds {result.per_night_usd:,.2f} USD"
    )
    if result.ceilings:
        lines.append(
            "  worst case an hour, every GPU NodePool at its nvidia.com/gpu limit: "
            f"{result.worst_case_hourly_usd:,.2f} USD"
        )
        for ceiling in result.ceilings:
            lines.append(
                f"    {ceiling.pool} ({ceiling.capacity}): {ceiling.gpu_limit} GPUs x {ceiling.usd_per_gpu_hour:.3f} "
                f"(GPU-hour of {ceiling.dearest_type}) = {ceiling.hourly_usd:,.2f}"
            )
    usage = ", ".join(f"{key}={value:g}" for key, value in result.usage.model_dump().items())
    lines.append(f"  assumed volumes: {usage}")
    lines.append("  prices: infra/pricing/prices.json (refresh: python -m infra.pricing.refresh)")
    return "\n".join(lines)
