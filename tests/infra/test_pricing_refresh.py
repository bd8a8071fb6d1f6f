"""Refreshing the price table.

The Price List API is not implemented by moto, so its answers are replayed with botocore's Stubber from
tests/infra/data/pricing_get_products.json (hand-written in the API's shape; the Stubber checks every request
against the real API model). Spot prices come from the moto server's EC2 DescribeSpotPriceHistory over HTTP.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from infra.ops.refresh_prices import SERVICE_QUERIES, RefreshError, on_demand_usd, refresh_region, service_prices
from infra.pricing.table import load_prices

RECORDED = json.loads((Path(__file__).parent / "data" / "pricing_get_products.json").read_text())
NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _pricing() -> Any:
    return boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def _terms(region: str, *pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in [("regionCode", region), *pairs]]


def _expect(stub: Stubber, service_code: str, filters: list[dict[str, str]], products: list[Any]) -> None:
    stub.add_response(
        "get_products",
        # The API sends each product as a JSON document in a string.
        {"FormatVersion": "aws_v1", "PriceList": [json.dumps(product) for product in products]},
        {"ServiceCode": service_code, "Filters": filters, "FormatVersion": "aws_v1"},
    )


def _expect_instance(stub: Stubber, instance_type: str) -> None:
    filters = _terms(
        "us-east-1",
        ("instanceType", instance_type),
        ("operatingSystem", "Linux"),
        ("tenancy", "Shared"),
        ("preInstalledSw", "NA"),
        ("capacitystatus", "Used"),
        ("licenseModel", "No License required"),
    )
    _expect(stub, "AmazonEC2", filters, RECORDED["instances"][instance_type])


def _expect_services(stub: Stubber) -> None:
    # One call per service and filter set, in the order SERVICE_QUERIES first needs them.
    _expect(stub, "AmazonEKS", _terms("us-east-1"), RECORDED["services"]["AmazonEKS"])
    nat = _terms("us-east-1", ("productFamily", "NAT Gateway"))
    _expect(stub, "AmazonEC2", nat, RECORDED["services"]["AmazonEC2/NAT Gateway"])
    _expect(stub, "AmazonVPC", _terms("us-east-1"), RECORDED["services"]["AmazonVPC"])
    _expect(stub, "AmazonS3", _terms("us-east-1"), RECORDED["services"]["AmazonS3"])
    storage = _terms("us-east-1", ("productFamily", "Storage"))
    _expect(stub, "AmazonEC2", storage, RECORDED["services"]["AmazonEC2/Storage"])
    _expect(stub, "AmazonCloudWatch", _terms("us-east-1"), RECORDED["services"]["AmazonCloudWatch"])
    _expect(stub, "awskms", _terms("us-east-1"), RECORDED["services"]["awskms"])
    _expect(stub, "AmazonECR", _terms("us-east-1"), RECORDED["services"]["AmazonECR"])


def test_refresh_reads_every_price_from_the_recorded_price_list_and_spot_from_moto(moto_reset: str) -> None:
    table = load_prices()
    pricing = _pricing()
    ec2 = boto3.client("ec2", region_name="us-east-1")
    with Stubber(pricing) as stub:
        for instance_type in ("g5.xlarge", "p4d.24xlarge", "m5.xlarge"):
            _expect_instance(stub, instance_type)
        _expect_services(stub)
        new = refresh_region(table, "us-east-1", ["g5.xlarge", "p4d.24xlarge", "m5.xlarge"], pricing, ec2, NOW)
        stub.assert_no_pending_responses()

    region = new.regions["us-east-1"]
    assert new.dated_source("us-east-1")[0] == "2026-11-29"
    assert "Price List API" in new.dated_source("us-east-1")[1]
    assert region.ec2["p4d.24xlarge"].on_demand_hourly == pytest.approx(21.9576)
    assert (region.ec2["p4d.24xlarge"].vcpus, region.ec2["p4d.24xlarge"].gpus) == (96, 8)
    assert (region.ec2["m5.xlarge"].vcpus, region.ec2["m5.xlarge"].gpus) == (4, 0)
    # moto's Spot price history quotes the same price in every AZ offering the type.
    assert region.ec2["g5.xlarge"].spot_hourly == pytest.approx(0.00001)

    services = region.services
    assert services.eks_control_plane_hourly == pytest.approx(0.10)
    # Extended support is its own product beside perCluster, billed on top of it (issue 33).
    assert services.eks_extended_support_hourly == pytest.approx(0.50)
    assert services.interface_endpoint_hourly_per_az == pytest.approx(0.01)  # not the Bytes product next to it
    assert services.interface_endpoint_per_gb == pytest.approx(0.01)  # first tier of three
    assert services.public_ipv4_hourly == pytest.approx(0.005)
    assert services.s3_standard_gb_month == pytest.approx(0.023)
    assert services.s3_glacier_flexible_gb_month == pytest.approx(0.0036)
    assert services.ebs_gp3_gb_month == pytest.approx(0.08)  # not gp2
    assert services.cloudwatch_logs_ingest_per_gb == pytest.approx(0.50)  # the free tier is skipped
    assert services.cloudwatch_dashboard_month == pytest.approx(3.0, abs=1e-3)  # per hour x 730
    assert services.kms_key_month == pytest.approx(1.0)
    # Other regions keep the hand-entered figures and the table's own date.
    assert new.regions["us-west-2"] == table.regions["us-west-2"]
    assert new.dated_source("us-west-2") == (table.as_of, table.source)
    assert set(SERVICE_QUERIES) == set(type(services).model_fields)


def test_a_missing_product_is_named() -> None:
    pricing = _pricing()
    with Stubber(pricing) as stub:
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []})
        with pytest.raises(RefreshError, match="eks_control_plane_hourly: no AmazonEKS product with usage type"):
            service_prices(pricing, "us-east-1")


def test_free_only_product_is_an_error() -> None:
    product = json.loads(json.dumps(RECORDED["services"]["AmazonCloudWatch"][1]))
    for term in product["terms"]["OnDemand"].values():
        for dim in term["priceDimensions"].values():
            dim["pricePerUnit"]["USD"] = "0.0000000000"
    with pytest.raises(RefreshError, match="no paid on-demand USD price"):
        on_demand_usd(product)
