"""What a stack's services bill besides its nodes and network: its secrets and the Step Functions transitions of
its schedules. Counted from the plan and the state machines' definitions, priced from infra/facts/idle_prices.json
(dated, with its source).

Idle (the `fixed` group): every secret all month; the GPU sweep every `timing.SWEEP_MINUTES`, each execution taking
its release path (no run going); the nightly schedule every night, each finding no input (the skip path). The
Batch API's tick's S3 requests are infra/pricing/batch_api_requests.py's. A night (the `compute` group): what a run
night's execution adds over an empty night's, its polls of the run's markers every `timing.poll_seconds` for the
nightly window and the boot. Step Functions bills a transition for each state an execution enters
(infra/statemachines/graph.py `walk`).

The free tier: an account's first 4,000 transitions, 10 alarms and 3 dashboards a month bill nothing. With
`free_tier` (the default) the estimate assumes the stack has them to itself, the idle lines first; `python -m
infra.plan STACK --no-free-tier` prices every unit, as in an account whose free tier other stacks use up. Secrets
Manager and S3 have no always-free tier (a 30-day trial, a new account's first year): never subtracted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import date
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from infra import statemachines
from infra.pricing.estimate import HOURS_PER_MONTH, NIGHTS_PER_MONTH, Estimate, LineItem, line_item
from infra.statemachines import graph, timing
from infra.statemachines.queue import with_queue

if TYPE_CHECKING:
    # Types only: the config model reads facts, whose staleness check reads this module's table (no circle).
    from infra.config import StackConfig

PRICES_FILE = Path(__file__).resolve().parent.parent / "facts" / "idle_prices.json"
SECRET = "aws:secretsmanager/secret:Secret"


class IdlePrices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    secret_month: float = Field(gt=0, description="Secrets Manager, per secret a month")
    sfn_per_1000_transitions: float = Field(gt=0, description="Step Functions Standard, per 1,000 state transitions")
    s3_list_per_1000: float = Field(gt=0, description="S3 Standard LIST (and PUT, COPY, POST), per 1,000 requests")
    s3_get_per_1000: float = Field(gt=0, description="S3 Standard GET, per 1,000 requests")


class FreeTier(BaseModel):
    """An account's always-free allowances a month (not the 12-month free tier of new accounts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloudwatch_dashboards: int = Field(ge=0)
    cloudwatch_alarms: int = Field(ge=0, description="Standard-resolution alarm metrics")
    sfn_transitions: int = Field(ge=0)


class IdlePriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    checked: date
    source: str = Field(min_length=20)
    how: str = Field(min_length=10)
    free_tier: FreeTier
    regions: dict[str, IdlePrices]


@cache
def load_idle_prices() -> IdlePriceTable:
    return IdlePriceTable.model_validate(json.loads(PRICES_FILE.read_text()))


def free_tier(assumed: bool) -> FreeTier:
    """The allowances the estimate subtracts: the table's, or none (`--no-free-tier`)."""
    return (
        load_idle_prices().free_tier
        if assumed
        else FreeTier(cloudwatch_dashboards=0, cloudwatch_alarms=0, sfn_transitions=0)
    )


def _definition(config: StackConfig) -> dict[str, Any]:
    """The nightly machine's definition as deployed (placeholders left: a walk needs only its shape)."""
    kind = "asg" if config.tier == "small" else "eks"
    definition = statemachines.load(statemachines.NIGHTLY[kind])
    if config.batch_api.enabled:
        # Only the shape matters here: the drain's function name and poll numbers do not move an edge.
        definition = with_queue(definition, {"TickFunction": "tick", "MaxPolls": 1, "QueuePollBudget": 1}, 0)
    return definition


def _night_input_choice(config: StackConfig) -> str:
    # The schedule passes its scheduled time; with the Batch API the tick starts the night's run with its date.
    return "PlanRun" if config.batch_api.enabled else "DateFromScheduledTime"


def empty_night_transitions(config: StackConfig) -> int:
    """One night with no input: the nightly execution's skip path."""
    definition = _definition(config)
    return len(graph.walk(definition, definition["StartAt"], {"ResolveDate": _night_input_choice(config)}))


def sweep_transitions(config: StackConfig) -> int:
    """One GPU sweep with no run going: its release path (the same on every tier's sweep definition)."""
    kind = "asg" if config.tier == "small" else "eks"
    definition = statemachines.load(statemachines.SWEEP[kind])
    return len(graph.walk(definition, definition["StartAt"]))


def run_night_polls(config: StackConfig) -> int:
    """The polls of one run night: every `poll_seconds` through the boot and the nightly window."""
    minutes = config.cost.nightly_hours * 60 + config.cost.boot_minutes
    return math.ceil(minutes * 60 / timing.poll_seconds(config.schedule.run_deadline_minutes))


def run_night_transitions(config: StackConfig) -> int:
    """One run night that ends well: the start, every poll but the last, and the last poll's path to the end."""
    definition = _definition(config)
    picks = {"ResolveDate": _night_input_choice(config), "InputPresent": "InitCounters"}
    start = graph.walk(definition, definition["StartAt"], picks, stop="WaitForJob")
    poll = graph.walk(definition, "WaitForJob", stop="WaitForJob")
    ended = "NextBatch" if config.batch_api.enabled else "ReleaseAfterSuccess"
    last = graph.walk(definition, "WaitForJob", {"SummaryWritten": ended})
    return len(start) + (run_night_polls(config) - 1) * len(poll) + len(last)


def _prices(region: str) -> tuple[IdlePrices, str]:
    table = load_idle_prices()
    if region in table.regions:
        return table.regions[region], ""
    return table.regions["us-east-1"], " (us-east-1 price)"


def idle_items(
    config: StackConfig, plan: Iterable[dict[str, Any]] | None, assume_free_tier: bool = True
) -> list[LineItem]:
    """The idle month's service lines and a run night's transitions; secrets are counted from `plan` (none
    without one, as the estimate counts alarms)."""
    prices, where = _prices(config.region)
    free = free_tier(assume_free_tier)
    items: list[LineItem] = []
    secrets = sum(1 for item in plan or () if item.get("type") == SECRET)
    if secrets:
        items.append(
            line_item("fixed", f"Secrets Manager secrets{where}", secrets, "secret-month", prices.secret_month)
        )
    per_transition = prices.sfn_per_1000_transitions / 1000
    sweeps = HOURS_PER_MONTH * 60 / timing.SWEEP_MINUTES
    idle = sweeps * sweep_transitions(config) + NIGHTS_PER_MONTH * empty_night_transitions(config)
    label = f"Step Functions: {sweeps:,.0f} GPU sweeps + {NIGHTS_PER_MONTH:.1f} nights with no input{where}"
    items.append(line_item("fixed", label, idle, "transition", per_transition, free.sfn_transitions))
    night = NIGHTS_PER_MONTH * (run_night_transitions(config) - empty_night_transitions(config))
    label = f"Step Functions: a night's {run_night_polls(config)} polls of the run{where}"
    left = max(0.0, free.sfn_transitions - idle)  # the free tier the idle month leaves
    items.append(line_item("compute", label, night, "transition", per_transition, left))
    return items


def with_idle(
    result: Estimate, config: StackConfig, plan: Iterable[dict[str, Any]] | None, assume_free_tier: bool = True
) -> Estimate:
    """The estimate with these lines added (the hook in infra.ops.stacks.stack_estimate)."""
    return result.model_copy(update={"items": (*result.items, *idle_items(config, plan, assume_free_tier))})
