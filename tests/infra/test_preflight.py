"""Preflight quota checks.

moto's Service Quotas backend answers only the `vpc` service code, so nothing real serves EC2 quotas here:
these tests replay recorded responses (tests/infra/data/service_quotas_ec2.json, in the API's shape) through
botocore's Stubber, which also checks every request against the real Service Quotas API model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from infra.ops.preflight import QUOTAS, PreflightError, check_quotas, family, format_checks, needed_vcpus
from infra.pricing.estimate import NodePool
from infra.pricing.table import load_prices

RECORDED = json.loads((Path(__file__).parent / "data" / "service_quotas_ec2.json").read_text())
PRICES = load_prices()


def _client() -> Any:
    return boto3.client("service-quotas", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def _applied(stub: Stubber, code: str) -> None:
    stub.add_response(
        "get_service_quota", RECORDED["get_service_quota"][code], {"ServiceCode": "ec2", "QuotaCode": code}
    )


def _default(stub: Stubber, code: str) -> None:
    """The account never changed this quota: GetServiceQuota says NoSuchResource, the default applies."""
    stub.add_client_error(
        "get_service_quota",
        service_error_code="NoSuchResourceException",
        http_status_code=400,
        expected_params={"ServiceCode": "ec2", "QuotaCode": code},
    )
    stub.add_response(
        "get_aws_default_service_quota",
        RECORDED["get_aws_default_service_quota"][code],
        {"ServiceCode": "ec2", "QuotaCode": code},
    )


def test_families_map_to_the_right_quota_codes() -> None:
    assert family("g5.xlarge") == "G"
    assert family("g4dn.12xlarge") == "G"
    assert family("vt1.3xlarge") == "G"
    assert family("p4d.24xlarge") == "P"
    assert family("m5.xlarge") == "Standard"
    assert QUOTAS[("G", "on-demand")].code == "L-DB2E81BA"
    assert QUOTAS[("P", "on-demand")].code == "L-417A185B"
    assert QUOTAS[("G", "spot")].code == "L-3819A6DF"
    assert QUOTAS[("P", "spot")].code == "L-7212CCBC"
    with pytest.raises(ValueError, match="not an EC2 instance type"):
        family("big-gpu")
    with pytest.raises(ValueError, match="no quota mapping"):
        family("inf2.xlarge")


def test_needs_add_up_per_quota_with_counts_rounded_up() -> None:
    pools = [
        NodePool(name="a", instance_type="g5.2xlarge", count=2, hours_per_month=1, capacity="spot"),
        NodePool(name="b", instance_type="g5.12xlarge", count=1.5, hours_per_month=1, capacity="spot"),
        NodePool(name="head", instance_type="m5.xlarge", count=1, hours_per_month=730, capacity="on-demand"),
    ]
    needs = needed_vcpus(pools, "us-east-1", PRICES)
    assert needs[QUOTAS[("G", "spot")]] == (2 * 8 + 2 * 48, {"g5.2xlarge", "g5.12xlarge"})
    assert needs[QUOTAS[("Standard", "on-demand")]] == (4, {"m5.xlarge"})


def test_raised_quota_passes_default_zero_quotas_get_a_request() -> None:
    pools = [
        NodePool(name="spot", instance_type="g5.2xlarge", count=2, hours_per_month=1, capacity="spot"),
        NodePool(name="od", instance_type="g5.xlarge", count=1, hours_per_month=1, capacity="on-demand"),
        NodePool(name="p", instance_type="p4d.24xlarge", count=1, hours_per_month=1, capacity="spot"),
        NodePool(name="head", instance_type="m5.xlarge", count=1, hours_per_month=730, capacity="on-demand"),
    ]
    client = _client()
    with Stubber(client) as stub:
        # check_quotas asks in quota-code order.
        _applied(stub, "L-1216C47A")
        _applied(stub, "L-3819A6DF")
        _default(stub, "L-7212CCBC")
        _default(stub, "L-DB2E81BA")
        checks = check_quotas(client, pools, "us-east-1", PRICES)
        stub.assert_no_pending_responses()

    by_code = {check.quota.code: check for check in checks}
    assert by_code["L-3819A6DF"].ok and by_code["L-3819A6DF"].needed_vcpus == 16
    assert by_code["L-1216C47A"].ok
    assert not by_code["L-DB2E81BA"].ok and by_code["L-DB2E81BA"].needed_vcpus == 4
    assert not by_code["L-7212CCBC"].ok and by_code["L-7212CCBC"].needed_vcpus == 96

    text = format_checks(checks, "us-east-1")
    assert "--quota-code L-7212CCBC --desired-value 96" in text
    assert "--quota-code L-DB2E81BA --desired-value 4" in text
    assert "--quota-code L-3819A6DF" not in text


def test_an_access_error_names_the_quota() -> None:
    client = _client()
    pools = [NodePool(name="gpu", instance_type="g5.xlarge", count=1, hours_per_month=1, capacity="spot")]
    with Stubber(client) as stub:
        stub.add_client_error("get_service_quota", service_error_code="AccessDeniedException", http_status_code=403)
        with pytest.raises(PreflightError, match=r"L-3819A6DF \(All G and VT Spot Instance Requests\) failed"):
            check_quotas(client, pools, "us-east-1", PRICES)
