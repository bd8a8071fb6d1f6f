"""The P-family GPU prices the large tier's eight-GPU pool can launch are from after AWS's June 2025 price cut,
each with its source and date, and warn when they go stale (issue 65, finding 6)."""

from __future__ import annotations

import statistics
from datetime import date, timedelta

from infra import facts
from infra.ops.stacks import offline_config
from infra.pricing.table import load_prices

CUT = date(2025, 6, 5)  # AWS What's New: up to 45% off P4d, P4de, P5 and P5en on-demand


def _p_family_types() -> set[str]:
    """Every P-family type a shipped stack's GPU pools may launch (the large tier's eight-GPU pool, today p4d)."""
    found: set[str] = set()
    for stack in ("large", "large-70b", "large-moe"):
        eks = offline_config(stack).eks
        found |= {t for t in (*eks.node_pool.instance_types, *eks.eight_gpu.node_pool.instance_types) if t[0] == "p"}
    return found


def test_each_p_family_price_is_dated_after_the_cut_with_its_source() -> None:
    prices = load_prices()
    types = _p_family_types()
    assert "p4d.24xlarge" in types
    for region in ("us-east-1", "us-west-2"):
        for instance_type in sorted(types):
            as_of, source = prices.dated_instance(region, instance_type)
            assert date.fromisoformat(as_of) > CUT, f"{instance_type} in {region}: priced {as_of}, before the cut"
            # Its own source (or a refresh's, for its region), not the hand-entered table's general note.
            assert source != prices.source, f"{instance_type} in {region} has no source of its own"


def test_p4d_is_the_post_cut_list_price_and_its_spot_figure_says_how_it_was_made() -> None:
    prices = load_prices()
    for region in ("us-east-1", "us-west-2"):
        row = prices.instance(region, "p4d.24xlarge")
        assert row.on_demand_hourly == 21.95764  # was 32.7726 before the cut
        assert row.source is not None and "derived, not observed" in row.source
        # The derivation its source states: the median Spot/on-demand ratio of the g5 rows, to 3 places.
        g5 = [r.spot_hourly / r.on_demand_hourly for t, r in prices.regions[region].ec2.items() if t.startswith("g5")]
        assert row.spot_hourly == round(row.on_demand_hourly * round(statistics.median(g5), 3), 2)


def test_a_dated_price_row_warns_when_stale() -> None:
    seen = date.fromisoformat(load_prices().instance("us-west-2", "p4d.24xlarge").as_of or "")
    name = "infra/pricing/prices.json p4d.24xlarge (us-west-2)"
    assert not [line for line in facts.stale_warnings(seen + timedelta(days=facts.MAX_AGE_DAYS)) if name in line]
    (line,) = [line for line in facts.stale_warnings(seen + timedelta(days=facts.MAX_AGE_DAYS + 1)) if name in line]
    assert "python -m infra.pricing.refresh --region us-west-2 --instance-type p4d.24xlarge" in line
