"""The estimate's arithmetic, checked against figures worked out by hand from the repo's price table."""

from __future__ import annotations

import pytest

from infra.pricing.estimate import (
    HOURS_PER_MONTH,
    EstimateInputs,
    FixedParts,
    NodePool,
    Usage,
    estimate,
    format_estimate,
    nightly_hours_per_month,
    price_text,
)
from infra.pricing.table import PriceTableError, load_prices

PRICES = load_prices()
NO_USAGE = Usage(s3_standard_gb=0, s3_glacier_gb=0, nat_gb=0, endpoint_gb=0, log_gb=0, ecr_gb=0)


def test_a_month_is_730_hours_and_a_nightly_pool_runs_its_hours_on_730_over_24_nights() -> None:
    assert HOURS_PER_MONTH == 730
    assert nightly_hours_per_month(4) == pytest.approx(4 * 730 / 24)  # 121.67 h
    assert nightly_hours_per_month(24) == pytest.approx(730)
    with pytest.raises(ValueError, match="hours_per_night must be between 0 and 24"):
        nightly_hours_per_month(25)


def test_spot_and_on_demand_pools_use_their_own_price() -> None:
    g5 = PRICES.instance("us-east-1", "g5.2xlarge")
    pools = (
        NodePool(
            name="workers",
            instance_type="g5.2xlarge",
            count=3,
            hours_per_month=100,
            capacity="spot",
            root_volume_gb=0,
        ),
        NodePool(
            name="head",
            instance_type="g5.2xlarge",
            count=1,
            hours_per_month=100,
            capacity="on-demand",
            root_volume_gb=0,
        ),
    )
    result = estimate(
        EstimateInputs(
            stack="t", region="us-east-1", nightly_pools=pools, fixed=FixedParts(kms_keys=0), usage=NO_USAGE
        ),
        PRICES,
    )
    compute = [item for item in result.items if item.group == "compute"]
    assert [item.monthly_usd for item in compute] == pytest.approx([300 * g5.spot_hourly, 100 * g5.on_demand_hourly])
    assert compute[0].quantity == 300  # 3 instances x 100 h
    # Nothing else: no usage, no fixed parts, no monitoring resources (log ingestion is a zero line).
    assert result.total == pytest.approx(300 * g5.spot_hourly + 100 * g5.on_demand_hourly)


def test_root_volumes_are_billed_for_the_share_of_the_month_their_instances_exist() -> None:
    pool = NodePool(
        name="gpu",
        instance_type="g5.xlarge",
        count=2,
        hours_per_month=365,
        capacity="spot",
        root_volume_gb=200,
    )
    result = estimate(
        EstimateInputs(
            stack="t", region="us-east-1", nightly_pools=(pool,), fixed=FixedParts(kms_keys=0), usage=NO_USAGE
        ),
        PRICES,
    )
    (volumes,) = [item for item in result.items if "root volumes" in item.item]
    assert volumes.quantity == pytest.approx(200.0)  # 2 x 200 GB for half a month
    assert volumes.monthly_usd == pytest.approx(200 * 0.08)


def test_fixed_parts_worked_by_hand() -> None:
    """EKS + one NAT + 4 endpoints in 2 AZs + an always-on m5.xlarge head, at the table's us-east-1 prices."""
    fixed = FixedParts(
        eks_clusters=1,
        nat_gateways=1,
        interface_endpoints=4,
        endpoint_azs=2,
        always_on_nodes=(
            NodePool(
                name="head",
                instance_type="m5.xlarge",
                count=1,
                hours_per_month=730,
                capacity="on-demand",
                root_volume_gb=50,
            ),
        ),
        kms_keys=1,
        alarms=10,
        dashboards=1,
    )
    usage = Usage(s3_standard_gb=100, s3_glacier_gb=1000, nat_gb=50, endpoint_gb=200, log_gb=5, ecr_gb=10)
    result = estimate(EstimateInputs(stack="t", region="us-east-1", fixed=fixed, usage=usage), PRICES)
    by_item = {item.item: item.monthly_usd for item in result.items}
    assert by_item["EKS control plane"] == pytest.approx(73.00)  # 730 h x 0.10
    assert by_item["NAT gateway"] == pytest.approx(32.85)  # 730 h x 0.045
    assert by_item["NAT gateway public IPv4"] == pytest.approx(3.65)  # 730 h x 0.005
    assert by_item["NAT data processed"] == pytest.approx(2.25)  # 50 GB x 0.045
    assert by_item["interface VPC endpoints"] == pytest.approx(58.40)  # 4 x 2 AZ x 730 h x 0.01
    assert by_item["endpoint data processed"] == pytest.approx(2.00)  # 200 GB x 0.01
    assert by_item["head: 1 x m5.xlarge on-demand, 730 h"] == pytest.approx(140.16)  # 730 h x 0.192
    assert by_item["head: gp3 root volumes"] == pytest.approx(4.00)  # 50 GB x 0.08
    assert by_item["KMS keys"] == pytest.approx(1.00)
    assert by_item["S3 Standard"] == pytest.approx(2.30)
    assert by_item["S3 Glacier Flexible Retrieval"] == pytest.approx(3.60)
    assert by_item["ECR images"] == pytest.approx(1.00)
    assert by_item["CloudWatch Logs ingestion"] == pytest.approx(2.50)
    assert by_item["CloudWatch alarms"] == pytest.approx(1.00)
    assert by_item["CloudWatch dashboards"] == pytest.approx(3.00)
    # Alarms and dashboards bill with no run: idle, with the key (no free tier asked for here).
    assert result.subtotal("fixed") == pytest.approx(73 + 32.85 + 3.65 + 2.25 + 58.4 + 2 + 140.16 + 4 + 1 + 1 + 3)
    assert result.total == pytest.approx(sum(by_item.values()))
    assert result.total == pytest.approx(321.31 + 6.90 + 2.50)  # fixed + storage + monitoring (the logs)


def test_the_printed_estimate_shows_every_item_the_total_and_the_price_date() -> None:
    pool = NodePool(
        name="gpu",
        instance_type="g5.xlarge",
        count=1,
        hours_per_month=nightly_hours_per_month(4),
        capacity="spot",
    )
    result = estimate(EstimateInputs(stack="small", region="us-east-1", nightly_pools=(pool,)), PRICES)
    text = format_estimate(result)
    assert f"prices of {PRICES.as_of}" in text
    assert f"total: {result.total:,.2f} USD a month" in text
    for item in result.items:
        assert item.item[:40] in text
    assert "assumed volumes: s3_standard_gb=100" in text


def test_unknown_instance_type_and_region_are_named() -> None:
    pool = NodePool(name="gpu", instance_type="g9.huge", count=1, hours_per_month=10, capacity="spot")
    with pytest.raises(PriceTableError, match=r"'g9\.huge' has no price for us-east-1"):
        estimate(EstimateInputs(stack="t", region="us-east-1", nightly_pools=(pool,)), PRICES)
    with pytest.raises(PriceTableError, match="region 'ap-south-2' is not in the price table"):
        estimate(EstimateInputs(stack="t", region="ap-south-2"), PRICES)


def test_price_table_carries_its_date_and_source_and_covers_the_tiers_instance_types() -> None:
    assert PRICES.as_of
    assert "Price List API" in PRICES.source
    for region in ("us-east-1", "us-west-2"):
        for instance_type in ("g5.xlarge", "g5.2xlarge", "g5.12xlarge", "p4d.24xlarge", "m5.xlarge"):
            price = PRICES.instance(region, instance_type)
            assert 0 < price.spot_hourly < price.on_demand_hourly


@pytest.mark.parametrize(
    ("price", "text"),
    [
        (1, "1.00"),
        (0.43, "0.43"),
        (0.000025, "0.000025"),
        (0.0042, "0.0042"),
        (21.95764, "21.95764"),
        (1234.5, "1,234.50"),
    ],
)
def test_unit_prices_print_as_a_price_list_writes_them(price: float, text: str) -> None:
    """No float noise (2.5e-05) and cents at least, on the terminal and in docs/cost.md."""
    assert price_text(price) == text
