"""Zones chosen where the tier's instance types are offered (issue 33): the choice, the Network component under
the plan's mocks, and the committed plans.

The mocks' DescribeInstanceTypeOfferings answer (infra/ops/plan_mocks.py OFFERING_GAPS) is a stand-in shaped like
AWS's, not AWS's table: zone a offers no p4d and zone e no g5 or p4d. What AWS really offers where is the
preflight's to read (tests/infra/test_preflight_account.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra.aws_context import AwsContext
from infra.components.network import Network, NetworkArgs
from infra.ops.plan import run_under_mocks
from infra.ops.plan_mocks import OFFERING_GAPS
from infra.zones import ZoneError, choose_zones

Plan = list[dict[str, Any]]
CONTEXT = AwsContext(account_id="123456789012", partition="aws", region="us-east-1", dns_suffix="amazonaws.com")


def _private_zones(plan: Plan, kind: str = "private") -> list[str]:
    return sorted(
        item["inputs"]["availabilityZone"]
        for item in plan
        if item["type"] == "aws:ec2/subnet:Subnet" and f"-{kind}-" in item["name"]
    )


def test_zones_must_offer_every_required_type_and_rank_by_the_preferred() -> None:
    offered = {
        "z1": {"g5", "m5"},
        "z2": {"g5", "m5", "p4d"},
        "z3": {"m5"},
        "z4": {"g5", "m5", "p4d"},
        "z5": {"g5", "m5"},
    }
    zones = ["z1", "z2", "z3", "z4", "z5"]
    assert choose_zones(zones, offered, ["g5", "m5"], ["p4d"], 2) == ["z2", "z4"]
    assert choose_zones(zones, offered, ["g5", "m5"], ["p4d"], 3) == ["z1", "z2", "z4"]  # then by name
    assert choose_zones(zones, offered, ["g5"], [], 2) == ["z1", "z2"]
    with pytest.raises(ZoneError, match=r"network.az_count is 5 but only 4 of the zones .* offer g5, m5"):
        choose_zones(zones, offered, ["g5", "m5"], [], 5)


def test_the_network_puts_no_subnet_where_the_gpu_type_is_not_offered() -> None:
    assert OFFERING_GAPS == {"a": ("p4d.",), "e": ("g5.", "p4d.")}
    args = NetworkArgs(
        stack="test",
        context=CONTEXT,
        vpc_cidr="10.40.0.0/16",
        az_count=3,
        single_nat_gateway=True,
        interface_endpoints=[],
        required_instance_types=["p4d.24xlarge"],
    )
    plan = run_under_mocks(lambda: Network("network", args), stack="test")
    assert _private_zones(plan) == ["us-east-1b", "us-east-1c", "us-east-1d"]
    too_many = NetworkArgs(**{**args.__dict__, "az_count": 5})
    with pytest.raises(Exception, match=r"network\.az_count is 5 but only 4 of the zones"):
        run_under_mocks(lambda: Network("network", too_many), stack="test")


def test_the_large_plan_puts_its_zones_where_its_gpu_types_are_offered(plan_for: Callable[[str], Plan]) -> None:
    """Large needs g5.xlarge and m5.xlarge in each zone and prefers g5.2xlarge (its NodePool lists one-GPU types
    only, docs/model-and-nodes.md), which the mocks' zones a-d all offer: the first three by name."""
    assert _private_zones(plan_for("large")) == ["us-west-2a", "us-west-2b", "us-west-2c"]
    # The small tier's node runs in public subnets (network.egress: public_subnets): no private ones at all.
    assert _private_zones(plan_for("small")) == []
    assert _private_zones(plan_for("small"), "public") == ["us-east-1a", "us-east-1b"]
