"""Refresh infra/pricing/prices.json from AWS where credentials exist.

On-demand EC2 and service prices come from the AWS Price List API (`pricing:GetProducts`, served from
us-east-1); Spot prices, which the Price List API does not carry, from EC2's Spot price history (the median
of the current price across the region's Availability Zones).

    python -m infra.pricing.refresh --region us-east-1 [--instance-type g5.xlarge ...] [--dry-run]

Usage-type names follow AWS's published price list; where one is missing for a region the tool stops and names
it rather than keeping a stale figure silently.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.pricing.table import DEFAULT_TABLE, InstancePrice, PriceTable, RegionPrices, ServicePrices

PRICE_LIST_REGION = "us-east-1"


class RefreshError(RuntimeError):
    """A price could not be found in AWS's answer; the message names the item, service and region."""


@dataclass(frozen=True)
class ServiceQuery:
    """Where one service price lives: Price List service code, usage-type suffix, narrowing filters."""

    service_code: str
    usagetype_suffix: str
    filters: tuple[tuple[str, str], ...] = ()


# usagetype carries a region prefix (USE1-, USW2-...) except for some older us-east-1 items: match on the end.
SERVICE_QUERIES: dict[str, ServiceQuery] = {
    "eks_control_plane_hourly": ServiceQuery("AmazonEKS", "AmazonEKS-Hours:perCluster"),
    # Billed on top of perCluster while the cluster's version is in extended support ($0.50 + $0.10 = $0.60).
    "eks_extended_support_hourly": ServiceQuery("AmazonEKS", "AmazonEKS-Hours:extendedSupport"),
    "nat_gateway_hourly": ServiceQuery("AmazonEC2", "NatGateway-Hours", (("productFamily", "NAT Gateway"),)),
    "nat_gateway_per_gb": ServiceQuery("AmazonEC2", "NatGateway-Bytes", (("productFamily", "NAT Gateway"),)),
    "public_ipv4_hourly": ServiceQuery("AmazonVPC", "PublicIPv4:InUseAddress"),
    "interface_endpoint_hourly_per_az": ServiceQuery("AmazonVPC", "VpcEndpoint-Hours"),
    "interface_endpoint_per_gb": ServiceQuery("AmazonVPC", "VpcEndpoint-Bytes"),
    "s3_standard_gb_month": ServiceQuery("AmazonS3", "TimedStorage-ByteHrs"),
    "s3_glacier_flexible_gb_month": ServiceQuery("AmazonS3", "TimedStorage-GlacierByteHrs"),
    "ebs_gp3_gb_month": ServiceQuery("AmazonEC2", "EBS:VolumeUsage.gp3", (("productFamily", "Storage"),)),
    "cloudwatch_alarm_month": ServiceQuery("AmazonCloudWatch", "CW:AlarmMonitorUsage"),
    "cloudwatch_dashboard_month": ServiceQuery("AmazonCloudWatch", "DashboardsUsageHour-Basic"),
    "cloudwatch_logs_ingest_per_gb": ServiceQuery("AmazonCloudWatch", "DataProcessing-Bytes"),
    "kms_key_month": ServiceQuery("awskms", "KMS-Keys"),
    "ecr_storage_gb_month": ServiceQuery("AmazonECR", "TimedStorage-ByteHrs"),
}


def _filters(region: str, extra: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    pairs = [("regionCode", region), *extra]
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in pairs]


def _products(pricing: Any, service_code: str, filters: list[dict[str, str]]) -> Iterator[dict[str, Any]]:
    paginator = pricing.get_paginator("get_products")
    for page in paginator.paginate(ServiceCode=service_code, Filters=filters, FormatVersion="aws_v1"):
        for raw in page["PriceList"]:
            # Each entry is a JSON document in a string.
            yield json.loads(raw)


def on_demand_usd(product: dict[str, Any]) -> float:
    """The on-demand USD price of a product: its first paid tier (free tiers are listed at 0)."""
    dimensions = [
        dim
        for term in product.get("terms", {}).get("OnDemand", {}).values()
        for dim in term.get("priceDimensions", {}).values()
    ]
    dimensions.sort(key=lambda dim: float(dim.get("beginRange", "0")))
    for dim in dimensions:
        price = float(dim["pricePerUnit"].get("USD", "0"))
        if price > 0:
            return price
    sku = product.get("product", {}).get("sku", "?")
    raise RefreshError(f"product {sku} has no paid on-demand USD price")


def instance_price(pricing: Any, region: str, instance_type: str) -> tuple[float, int, int]:
    """On-demand Linux, shared tenancy, no pre-installed software: (USD per hour, vCPUs, GPUs)."""
    filters = _filters(
        region,
        (
            ("instanceType", instance_type),
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
            ("licenseModel", "No License required"),
        ),
    )
    products = list(_products(pricing, "AmazonEC2", filters))
    if len(products) != 1:
        raise RefreshError(
            f"expected one on-demand Linux product for {instance_type} in {region}, the Price List API "
            f"returned {len(products)}"
        )
    attributes = products[0]["product"]["attributes"]
    return on_demand_usd(products[0]), int(attributes["vcpu"]), int(attributes.get("gpu", "0") or 0)


def service_prices(pricing: Any, region: str) -> dict[str, float]:
    """Every price in SERVICE_QUERIES, asking the Price List API once per service and filter set."""
    fetched: dict[tuple[str, tuple[tuple[str, str], ...]], list[dict[str, Any]]] = {}
    prices: dict[str, float] = {}
    for name, query in SERVICE_QUERIES.items():
        key = (query.service_code, query.filters)
        if key not in fetched:
            fetched[key] = list(_products(pricing, query.service_code, _filters(region, query.filters)))
        matches = [
            product
            for product in fetched[key]
            if product["product"]["attributes"].get("usagetype", "").endswith(query.usagetype_suffix)
        ]
        if not matches:
            raise RefreshError(
                f"{name}: no {query.service_code} product with usage type *{query.usagetype_suffix} in {region}"
            )
        prices[name] = on_demand_usd(matches[0]) * _monthly(query.usagetype_suffix)
    return prices


def _monthly(usagetype: str) -> float:
    # Dashboards are priced per dashboard-hour in the list; the table keeps a month (730 h) per dashboard.
    return 730.0 if usagetype.endswith("DashboardsUsageHour-Basic") else 1.0


def spot_price(ec2: Any, instance_type: str, now: datetime) -> float:
    """Median of the current Linux Spot price across the region's AZs (each AZ's latest record)."""
    latest: dict[str, tuple[datetime, float]] = {}
    paginator = ec2.get_paginator("describe_spot_price_history")
    pages = paginator.paginate(
        InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX"], StartTime=now, EndTime=now
    )
    for page in pages:
        for record in page["SpotPriceHistory"]:
            zone = record["AvailabilityZone"]
            stamp = record.get("Timestamp", now)
            if zone not in latest or stamp > latest[zone][0]:
                latest[zone] = (stamp, float(record["SpotPrice"]))
    if not latest:
        raise RefreshError(f"no Spot price history for {instance_type}: not offered as Spot in this region?")
    return statistics.median(price for _, price in latest.values())


def refresh_region(
    table: PriceTable, region: str, instance_types: Iterable[str], pricing: Any, ec2: Any, now: datetime
) -> PriceTable:
    """A new table with `region`'s prices fetched; other regions stay as they were."""
    ec2_prices: dict[str, InstancePrice] = {}
    for instance_type in instance_types:
        hourly, vcpus, gpus = instance_price(pricing, region, instance_type)
        ec2_prices[instance_type] = InstancePrice(
            vcpus=vcpus, gpus=gpus, on_demand_hourly=hourly, spot_hourly=spot_price(ec2, instance_type, now)
        )
    services = ServicePrices.model_validate(service_prices(pricing, region))
    fetched = RegionPrices(
        ec2=ec2_prices,
        services=services,
        as_of=now.date().isoformat(),
        source="AWS Price List API (pricing:GetProducts) and EC2 Spot price history (median across AZs), "
        "fetched by python -m infra.pricing.refresh",
    )
    return table.model_copy(update={"regions": {**table.regions, region: fetched}})


def main(argv: list[str] | None = None) -> int:
    import boto3

    from workload.contract.cli_errors import HELP_EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m infra.pricing.refresh",
        description=__doc__.splitlines()[0],
        epilog="examples: python -m infra.pricing.refresh --region eu-west-1; "
        f"python -m infra.pricing.refresh --region us-west-2 --dry-run. {HELP_EPILOG}",
    )
    parser.add_argument("--region", default="us-east-1", help="the region to refresh (default us-east-1)")
    parser.add_argument(
        "--instance-type", action="append", default=[], help="instance types (default: those in the table)"
    )
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE)
    parser.add_argument("--dry-run", action="store_true", help="print the new table instead of writing it")
    args = parser.parse_args(argv)

    table = PriceTable.model_validate_json(args.table.read_text())
    instance_types = args.instance_type or sorted(table.regions.get(args.region, table.regions["us-east-1"]).ec2)
    pricing = boto3.client("pricing", region_name=PRICE_LIST_REGION)
    ec2 = boto3.client("ec2", region_name=args.region)
    try:
        new = refresh_region(table, args.region, instance_types, pricing, ec2, datetime.now(UTC))
    except RefreshError as err:
        print(f"refresh failed: {err}", file=sys.stderr)
        return 1
    text = new.model_dump_json(indent=2, exclude_none=True) + "\n"
    if args.dry_run:
        print(text)
    else:
        args.table.write_text(text)
        print(f"wrote {args.table} ({args.region}, {len(instance_types)} instance types, as of {new.as_of})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
