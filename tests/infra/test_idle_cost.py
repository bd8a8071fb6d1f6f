"""Every line a stack bills with no run is in its estimate, with the free tier it assumes said and undone by
`--no-free-tier` (infra/pricing/idle_cost.py; issue 65, finding 6: small's idle figure was the KMS key alone)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

import pytest

from infra import facts, statemachines
from infra.config import load_stack_config
from infra.ops.stacks import ROOT, stack_estimate
from infra.pricing import idle_cost
from infra.pricing.estimate import Estimate
from infra.statemachines import graph
from tests.infra.conftest import TIER_STACKS

ON = date(2026, 12, 6)
Plan = list[dict[str, Any]]


def _count(plan: Plan, typ: str) -> int:
    return sum(1 for item in plan if item["type"] == typ)


def _lines(result: Estimate, group: str) -> dict[str, Any]:
    return {item.item: item for item in result.items if item.group == group}


@pytest.mark.parametrize("stack", TIER_STACKS)
def test_each_idle_line_is_in_the_estimate_counted_from_the_plan(stack: str, plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for(stack)
    free, billed = (stack_estimate(stack, plan, on=ON, assume_free_tier=flag) for flag in (True, False))
    idle = _lines(billed, "fixed")
    assert idle["CloudWatch alarms"].quantity == _count(plan, "aws:cloudwatch/metricAlarm:MetricAlarm") >= 5
    assert idle["CloudWatch dashboards"].quantity == _count(plan, "aws:cloudwatch/dashboard:Dashboard") == 1
    assert idle["Secrets Manager secrets"].quantity == _count(plan, idle_cost.SECRET) == 2
    assert idle["KMS keys"].quantity == _count(plan, "aws:kms/key:Key")
    (transitions,) = [line for name, line in idle.items() if name.startswith("Step Functions")]
    assert transitions.quantity == pytest.approx(1460 * 4 + 730 / 24 * 8)  # sweeps' release path, empty nights' skip
    assert not [item for item in billed.items if item.group == "monitoring" and "alarm" in item.item]
    # Without the free tier every unit bills; with it, the first 10 alarms, 3 dashboards and 4,000 transitions don't.
    assert all(line.free_quantity == 0 for line in billed.items)
    free_idle = _lines(free, "fixed")
    assert free_idle["CloudWatch alarms"].monthly_usd == free_idle["CloudWatch dashboards"].monthly_usd == 0
    saved = idle["CloudWatch alarms"].monthly_usd + idle["CloudWatch dashboards"].monthly_usd + 4000 * 0.025 / 1000
    assert billed.idle_monthly_usd - free.idle_monthly_usd == pytest.approx(saved, abs=0.01)
    # Every idle line of the free-tier figure is in the no-free-tier one, at the same quantity.
    assert {name: line.quantity for name, line in free_idle.items()} == {n: x.quantity for n, x in idle.items()}


def test_the_small_tier_idles_at_more_than_its_key() -> None:
    """The figure the issue found ($1.00, the key alone) now holds the secrets and the transitions past the free
    tier; the alarms and the dashboard sit in the free tier."""
    plan = [{"type": idle_cost.SECRET}] * 2 + [{"type": "aws:kms/key:Key"}]
    result = stack_estimate("small", plan, on=ON)
    transitions = 1460 * 4 + 730 / 24 * 8
    assert result.idle_monthly_usd == pytest.approx(1.00 + 2 * 0.40 + (transitions - 4000) * 0.000025, abs=0.005)


def test_the_walked_paths_are_the_definitions_own() -> None:
    """Read by hand from infra/statemachines/*.asl.json: what each execution enters on an idle month and a night."""
    sweep = statemachines.load(statemachines.SWEEP["asg"])
    assert graph.walk(sweep, sweep["StartAt"]) == ["ListRunningRuns", "RunGoing", "ReleaseIdleCapacity", "Released"]
    small = statemachines.load(statemachines.NIGHTLY["asg"])
    assert graph.walk(small, small["StartAt"], {"ResolveDate": "DateFromScheduledTime"}) == [
        "ResolveDate",
        "DateFromScheduledTime",
        "PlanRun",
        "CheckInput",
        "InputPresent",
        "NotifySkipped",
        "ReportSkipped",
        "RunSkipped",
    ]
    poll = graph.walk(small, "WaitForJob", stop="WaitForJob")
    assert poll[:3] == ["WaitForJob", "CheckSummary", "SummaryWritten"] and poll[-2:] == [
        "KeepWaiting",
        "StartCapacity",
    ]
    config = load_stack_config("small", {"cost_center": "cc"})
    # 4 h and 15 min of boot, a poll every 72 s (a 360-minute deadline over at most 300 polls): 213 polls of 12.
    assert (config.cost.nightly_hours, config.cost.boot_minutes, config.schedule.run_deadline_minutes) == (4, 15, 360)
    assert idle_cost.run_night_polls(config) == 213 and len(poll) == 12
    with pytest.raises(ValueError, match="choice 'InputPresent' has no branch to 'Nowhere'"):
        graph.walk(small, small["StartAt"], {"ResolveDate": "PlanRun", "InputPresent": "Nowhere"})
    with pytest.raises(ValueError, match="never reached the choice"):
        graph.walk(sweep, sweep["StartAt"], {"InputPresent": "InitCounters"})


def test_a_night_adds_its_polls_past_the_free_tier_the_idle_month_left() -> None:
    config = load_stack_config("small", {"cost_center": "cc"})
    free = {item.item: item for item in idle_cost.idle_items(config, None)}
    (night,) = [item for item in free.values() if item.group == "compute"]
    per_night = idle_cost.run_night_transitions(config) - idle_cost.empty_night_transitions(config)
    # The start to StartCapacity (10), 212 polls of 12, the last poll to RunSucceeded (6), less the empty night's 8.
    assert per_night == 10 + 212 * 12 + 6 - 8
    assert night.quantity == pytest.approx(730 / 24 * per_night)
    assert night.free_quantity == 0  # the idle month's ~6,100 transitions took the 4,000


def test_with_the_batch_api_the_queue_drains_an_empty_night() -> None:
    """The tick's S3 requests are priced by infra/pricing/batch_api_requests.py (tests/infra/test_batch_api_cost.py)."""
    config = load_stack_config("small", {"cost_center": "cc", "batch_api": {"enabled": True}})
    assert not [item for item in idle_cost.idle_items(config, None) if "Batch API" in item.item]
    # With the queue an empty night asks the tick for the next run before it reports the skip.
    assert (
        idle_cost.empty_night_transitions(config) == 10
    )  # no date to derive (7), NextBatchAfterSkip, its choice, ReleaseAfterSkip


def test_the_idle_price_table_is_dated_sourced_and_fresh() -> None:
    table = idle_cost.load_idle_prices()
    assert "secrets-manager/pricing" in table.source and "step-functions/pricing" in table.source
    assert table.free_tier.cloudwatch_alarms == 10 and table.free_tier.sfn_transitions == 4000
    age = (datetime.now(UTC).date() - table.checked).days
    assert age <= facts.MAX_AGE_DAYS, f"{idle_cost.PRICES_FILE.name} checked {age} days ago: {table.how}"
    name = f"infra/facts/{idle_cost.PRICES_FILE.name}"
    assert not [line for line in facts.stale_warnings(table.checked) if name in line]
    (stale,) = [
        line for line in facts.stale_warnings(table.checked.replace(year=table.checked.year + 1)) if name in line
    ]
    assert "refresh it" in stale


def test_the_plan_cli_prices_every_unit_with_no_free_tier(plan_for: Callable[[str], Plan]) -> None:
    """`python -m infra.plan small --no-free-tier`: the figure of an account whose free tier other stacks use."""
    result = subprocess.run(
        [sys.executable, "-m", "infra.plan", "small", "--estimate-json", "--no-checks", "--no-free-tier"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    emitted = json.loads(result.stdout)
    assert all(item["free_quantity"] == 0 for item in emitted["items"])
    expected = stack_estimate("small", plan_for("small"), assume_free_tier=False)
    assert (
        emitted["idle_monthly_usd"]
        == expected.idle_monthly_usd
        > stack_estimate("small", plan_for("small")).idle_monthly_usd
    )
