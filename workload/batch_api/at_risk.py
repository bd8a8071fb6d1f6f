"""Batches that cannot finish in their window at the measured throughput, reported before they expire (issue 62).

The throughput is measured, not configured: each batch that completes adds its job's rows and wall time
(summary.json's `rows_in` and `wall_s`, the job's attempts summed, model load included) to a control record,
`records/control/throughput.json`, which keeps the last SAMPLES runs; the rate is their rows over their time
(a ratio of sums, so a large run counts for what it ran, and a small one's model load does not swamp it). The
nights' runs are not in it: their summaries live in the stack's `output/` folder, outside the API's store, and
the local server has none. Until one batch has completed there is no rate, and nothing is reported.

Each tick, with the queue in its order (priorities.py), a batch's rows ahead are the rows left of the running
batch and of every batch before it; at the rate, its last row would be answered at `now + (ahead + its own
left) / rate`. Past its `expires_at`, it is at risk, and its `llm_batch.at_risk` says by how much:

    {"rows_left": its own rows not yet answered, "rows_ahead": those before it,
     "rows_short": the rows the window cannot hold at the rate (what it would need beyond it),
     "rows_per_s": the measured rate, "rows_per_s_needed": the rate that would finish it in its window,
     "finishes_at": the estimate (epoch seconds), "as_of": when this was worked out}

`llm_batch` is the batch's one side field (objects.SIDE_FIELD), which the official client keeps (its Batch model
allows extra fields); a close drops the report (batches.py) and a finish puts the job's GPU share there, so a
closed batch carries no report. A
report is written when a batch becomes at risk or stops being so, and otherwise refreshed at most every
REFRESH_S (one alarm period), so a long queue costs a write per at-risk batch per period, not per tick. The
nights in the queue are not counted ahead of a batch: their rows are not known here (an underestimate, said in
docs/batch-api.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from workload.batch_api.batches import BatchBook
from workload.batch_api.models import BatchRecord, Record
from workload.batch_api.objects import AT_RISK
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict

THROUGHPUT_ID = "throughput"
SAMPLES = 20  # finished runs the rate is measured over: about a day of a busy queue
REFRESH_S = 300  # a standing report is refreshed at most this often (the alarms' period, metric_names.ALARM_PERIOD_S)


class Run(BaseModel):
    batch: str
    rows: int
    wall_s: float


class Throughput(Record):
    """The last SAMPLES completed runs, oldest first (records/control/throughput.json): a list, since the store
    writes a mapping's keys sorted."""

    KIND: ClassVar[str] = "control"

    runs: list[Run] = Field(default_factory=list)

    def rows_per_s(self) -> float | None:
        rows, seconds = sum(run.rows for run in self.runs), sum(run.wall_s for run in self.runs)
        return rows / seconds if rows > 0 and seconds > 0 else None


def record_run(records: Records, batch_id: str, summary: dict[str, Any] | None) -> None:
    """Add a completed batch's run to the measure (idempotent: a finish done twice adds it once)."""
    rows, seconds = int((summary or {}).get("rows_in") or 0), float((summary or {}).get("wall_s") or 0.0)
    if rows < 1 or seconds <= 0:
        return

    def add(measure: Throughput) -> None:
        if any(run.batch == batch_id for run in measure.runs):
            return
        measure.runs = [*measure.runs, Run(batch=batch_id, rows=rows, wall_s=seconds)][-SAMPLES:]

    for _ in range(2):  # made by the first run ever measured; a racing maker's record is changed instead
        try:
            records.update(Throughput, THROUGHPUT_ID, add, LookupError())
            return
        except LookupError:
            with contextlib.suppress(StoreConflict):
                records.create(Throughput(id=THROUGHPUT_ID, created_at=records.now(), seq=0))


def rate(records: Records) -> float | None:
    found = records.get(Throughput, THROUGHPUT_ID)
    return None if found is None else found.rows_per_s()


def left(record: BatchRecord) -> int:
    counts = record.request_counts
    return max(0, counts.total - counts.completed - counts.failed)


def assess(in_order: Iterable[BatchRecord], now: int, rows_per_s: float | None) -> dict[str, dict[str, Any]]:
    """The reports of the batches at risk, by id; `in_order`: the running batch, then the queue in its order."""
    if rows_per_s is None:
        return {}
    found: dict[str, dict[str, Any]] = {}
    ahead = 0
    for record in in_order:
        own = left(record)
        needed_s = (ahead + own) / rows_per_s
        if own and now + needed_s > record.expires_at:
            window_s = max(0, record.expires_at - now)
            found[record.id] = {
                "rows_left": own,
                "rows_ahead": ahead,
                "rows_short": min(own, _whole(ahead + own - rows_per_s * window_s)),
                "rows_per_s": _figure(rows_per_s),
                "rows_per_s_needed": _figure((ahead + own) / window_s) if window_s else None,
                "finishes_at": now + _whole(needed_s),
                "as_of": now,
            }
        ahead += own
    return found


def _whole(value: float) -> int:
    """Rounded up, past float noise: 26 rows less 24.000000000004 that fit is 2 rows short, not 3."""
    return math.ceil(round(value, 6))


def _figure(value: float) -> float:
    """Four significant digits: a rate of a row a minute and one of thousands a second both stay readable."""
    return float(f"{value:.4g}")


def _stale(old: dict[str, Any] | None, new: dict[str, Any] | None, now: int) -> bool:
    if (old is None) != (new is None):
        return True
    if old is None or new is None:
        return False
    figures = {key: value for key, value in new.items() if key != "as_of"}
    moved = figures != {key: value for key, value in old.items() if key != "as_of"}
    return moved and now - int(old.get("as_of") or 0) >= REFRESH_S


def report(batches: BatchBook, open_: Iterable[BatchRecord], found: dict[str, dict[str, Any]], now: int) -> None:
    """Write each open batch's report where it changed (module docstring: when, and how often)."""
    for record in open_:
        old = (record.llm_batch or {}).get(AT_RISK)
        new = found.get(record.id)
        if not _stale(old, new, now):
            continue

        def mark(current: BatchRecord, new: dict[str, Any] | None = new) -> None:
            if current.closed:  # the close's GPU share is the field now
                return
            side = {key: value for key, value in (current.llm_batch or {}).items() if key != AT_RISK}
            current.llm_batch = {**side, AT_RISK: new} if new is not None else side or None

        with contextlib.suppress(StoreConflict):  # busy record: the next tick writes it
            batches.update(record.id, mark)
