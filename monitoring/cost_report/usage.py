"""Usage and cost per batch and per key per day (issue 63), read from the stack's bucket as the Batch API keeps it.

A day's batches are the batches that closed on that UTC day: the retention's queue of done markers
(`batch-api/records/batch_done/<done_at>.<batch id>.json`, workload/batch_api/batch_index.py) is ordered by when
each batch closed, so one listing from the day's first second gives them, and each is read once. Nothing reads
every batch ever made, and a batch is counted once however often its close was retried: it has one record, and
one close (the record's compare-and-swap), so the markers of one batch all name the same record (deduplicated by
id here all the same). A day past the retention (30 days) has no markers left, and so no batches.

What a batch costs (BASIS, printed with every export):
- **its job**: the closed batch's `llm_batch` (objects.gpu_share): its job's wall time on the run's GPU nodes, at
  the stack's price per hour, from its summary.json. A batch that ran in a pool (several batches on one job,
  workload/batch_api/pools.py) carries its share of the pool's time, apportioned by the job by tokens
  (its summary's `share_basis`).
- **its share of the execution's boot and idle hold**: on the tiers a batch runs in an execution of the nightly
  state machine (its run's `batch-api/batches/<run>/execution.json`: the batch's own id, or its pool's), which
  holds the GPU nodes from its start (boot: nodes, image pull, model fetch) to its stop (the hold after the last
  job, until the machine's poll sees the summary and releases; and the hand-overs between runs). That time,
  less the job time of the batches that ran in it, is shared among those batches in proportion to their job
  time (equally when none has any), at the same price per hour (the batches' own cost over their job time).
  The execution's start and stop are Step Functions' (DescribeExecution); its batches are the closed batches whose
  run names it, found among those closed between its start and an hour after its stop. A run of it that is no
  such batch (a night of the schedule, a batch past its retention) is counted as `runs_unmatched`: its job time is
  then part of what is shared, so the batches' figure is an upper bound for that execution.
- Locally there is no execution (the local executor runs the job on this machine): a batch costs its job.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

API_PREFIX = "batch-api/"
DONE_PREFIX = f"{API_PREFIX}records/batch_done/"
BATCH_PREFIX = f"{API_PREFIX}records/batch/"
EXECUTIONS_PREFIX = f"{API_PREFIX}executions/"
DONE_DIGITS = 10  # batch_index.done_id: the close time in seconds, zero-padded
# A batch of an execution closes at the tick after its run ends; a tick is at most a few minutes apart.
CLOSE_AFTER_STOP_S = 3600
NO_OWNER = "(none)"  # a record written without an owner (none is, by the API)
BASIS = (
    "a batch's cost is its job's (llm_batch: its job's wall time on the GPU nodes at the stack's price per hour; "
    "a pooled batch's share of the pool's job, by tokens) plus its share of its execution's boot and idle hold "
    "(the execution's Step Functions start-to-stop time less its batches' job time, shared among its batches in "
    "proportion to their job time, at the same price per hour); a batch counts on the UTC day it closed"
)


@dataclass
class BatchUsage:
    id: str
    key: str
    day: str
    status: str
    model: str
    requests_completed: int = 0
    requests_failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    job_gpu_s: float = 0.0
    job_cost_usd: float = 0.0
    boot_hold_gpu_s: float = 0.0
    boot_hold_cost_usd: float = 0.0
    execution: str | None = None  # the execution's name, None where it ran on no execution (locally) or never ran

    @property
    def gpu_s(self) -> float:
        return self.job_gpu_s + self.boot_hold_gpu_s

    @property
    def cost_usd(self) -> float:
        return self.job_cost_usd + self.boot_hold_cost_usd

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "gpu_s": round(self.gpu_s, 3), "cost_usd": round(self.cost_usd, 6)}


# What a key's day sums of its batches.
SUMMED = (
    "requests_completed",
    "requests_failed",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "job_gpu_s",
    "boot_hold_gpu_s",
    "job_cost_usd",
    "boot_hold_cost_usd",
)


@dataclass
class KeyUsage:
    key: str
    day: str
    batches: int = 0
    requests_completed: int = 0
    requests_failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    job_gpu_s: float = 0.0
    boot_hold_gpu_s: float = 0.0
    gpu_s: float = 0.0
    job_cost_usd: float = 0.0
    boot_hold_cost_usd: float = 0.0
    cost_usd: float = 0.0


@dataclass
class ExecutionShare:
    """One execution's time and how it was shared (`provisional`: still running, shared as of now)."""

    name: str
    started: float
    stopped: float | None
    held_s: float
    job_s: float
    boot_hold_s: float
    price_per_hour_usd: float
    batches: list[str] = field(default_factory=list)
    runs: int | None = None  # the execution's runs as its marker counts them (sfn_executor.turn)
    runs_unmatched: int = 0
    provisional: bool = False


@dataclass
class DayUsage:
    day: str
    batches: list[BatchUsage]
    executions: list[ExecutionShare]
    basis: str = BASIS

    def by_key(self) -> list[KeyUsage]:
        """The day per key, most expensive first."""
        keys: dict[str, KeyUsage] = {}
        for batch in self.batches:
            row = keys.setdefault(batch.key, KeyUsage(batch.key, self.day))
            row.batches += 1
            for name in SUMMED:
                setattr(row, name, getattr(row, name) + getattr(batch, name))
        for row in keys.values():
            row.gpu_s, row.cost_usd = row.job_gpu_s + row.boot_hold_gpu_s, row.job_cost_usd + row.boot_hold_cost_usd
            for name in ("job_gpu_s", "boot_hold_gpu_s", "gpu_s"):
                setattr(row, name, round(getattr(row, name), 3))
            for name in ("job_cost_usd", "boot_hold_cost_usd", "cost_usd"):
                setattr(row, name, round(getattr(row, name), 6))
        return sorted(keys.values(), key=lambda row: (-row.cost_usd, row.key))

    @property
    def cost_usd(self) -> float:
        return sum(batch.cost_usd for batch in self.batches)

    def as_json(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "basis": self.basis,
            "cost_usd": round(self.cost_usd, 6),
            "keys": [asdict(row) for row in self.by_key()],
            "batches": [batch.row() for batch in self.batches],
            "executions": [asdict(e) for e in self.executions],
        }

    def as_csv(self, level: str = "key") -> str:
        """One row per key (`level="key"`) or per batch, with a header; the basis is the JSON's."""
        rows = [asdict(row) for row in self.by_key()] if level == "key" else [b.row() for b in self.batches]
        columns = list(asdict(KeyUsage("", ""))) if level == "key" else list(BatchUsage("", "", "", "", "").row())
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


def day_bounds(day: date) -> tuple[int, int]:
    start = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    return start, start + 86400


def batch_usage(record: dict[str, Any], execution: str | None = None) -> BatchUsage:
    """A closed batch's record as one usage row (its job's share only; `share` adds the execution's)."""
    usage = record.get("usage") or {}
    counts = record.get("request_counts") or {}
    share = record.get("llm_batch") or {}
    done_at = record.get("_done_at") or record.get("created_at") or 0
    return BatchUsage(
        id=str(record["id"]),
        key=str(record.get("_owner") or NO_OWNER),
        day=datetime.fromtimestamp(int(done_at), UTC).date().isoformat(),
        status=str(record.get("status")),
        model=str(record.get("model") or ""),
        requests_completed=int(counts.get("completed") or 0),
        requests_failed=int(counts.get("failed") or 0),
        input_tokens=int(usage.get("input_tokens") or 0),
        cached_tokens=int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        reasoning_tokens=int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
        job_gpu_s=float(share.get("job_wall_s") or 0.0),
        job_cost_usd=float(share.get("cost_usd") or 0.0),
        execution=execution,
    )


def share(
    batches: list[BatchUsage], name: str, started: float, stopped: float | None, now: float, runs: int | None = None
) -> ExecutionShare:
    """Share one execution's boot and hold among `batches` (every batch found to have run in it; see BASIS)."""
    held = max(0.0, (stopped if stopped is not None else now) - started)
    job = sum(b.job_gpu_s for b in batches)
    overhead = max(0.0, held - job)
    # The stack's price per hour, as the jobs applied it (their summaries round each cost to 1/100 of a cent).
    price = sum(b.job_cost_usd for b in batches) / job * 3600 if job > 0 else 0.0
    for batch in batches:
        part = batch.job_gpu_s / job if job > 0 else 1 / len(batches)
        batch.boot_hold_gpu_s = round(overhead * part, 3)
        batch.boot_hold_cost_usd = round(overhead * part * price / 3600, 6)
    return ExecutionShare(
        name=name,
        started=started,
        stopped=stopped,
        held_s=round(held, 3),
        job_s=round(job, 3),
        boot_hold_s=round(overhead, 3),
        price_per_hour_usd=round(price, 6),
        batches=sorted(b.id for b in batches),
        runs=runs,
        provisional=stopped is None,
    )


# ---- reading the bucket ------------------------------------------------------------------------------------------


class BucketReader:
    """The Batch API's objects in the stack's bucket (S3 `s3` client) and its executions (`sfn` client, optional:
    without it no execution is shared out)."""

    def __init__(self, s3: Any, bucket: str, sfn: Any = None, clock: Callable[[], float] | None = None) -> None:
        self.s3, self.bucket, self.sfn = s3, bucket, sfn
        self.clock = clock or (lambda: datetime.now(UTC).timestamp())
        self.records: dict[str, dict[str, Any] | None] = {}
        self.runs: dict[str, str | None] = {}  # a run's execution ARN (None: it names none)

    def json(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        found: dict[str, Any] = json.loads(body)
        return found

    def closed_between(self, start: int, end: int) -> list[str]:
        """The ids of the batches closed in [start, end): one listing of the done markers from `start`."""
        ids: list[str] = []
        after = f"{DONE_PREFIX}{start:0{DONE_DIGITS}d}"
        while True:
            page = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=DONE_PREFIX, StartAfter=after, MaxKeys=1000)
            keys = [str(item["Key"]) for item in page.get("Contents", [])]
            for key in keys:
                done_at, _, batch_id = key.removeprefix(DONE_PREFIX).removesuffix(".json").partition(".")
                if int(done_at) >= end:
                    return ids
                if batch_id not in ids:
                    ids.append(batch_id)
            if not page.get("IsTruncated") or not keys:
                return ids
            after = keys[-1]

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        if batch_id not in self.records:
            self.records[batch_id] = self.json(f"{BATCH_PREFIX}{batch_id}.json")
        return self.records[batch_id]

    def execution_of(self, record: dict[str, Any]) -> str | None:
        """The ARN of the execution the batch's (last) run was on: its own run's marker, or its pool's."""
        run = str(record.get("_pool") or record["id"])
        if run not in self.runs:
            arn = (self.json(f"{API_PREFIX}batches/{run}/execution.json") or {}).get("execution_arn")
            self.runs[run] = str(arn) if arn else None
        return self.runs[run]


def read_day(reader: BucketReader, day: date) -> DayUsage:
    """The day's usage: its closed batches, each with its share of its execution (see BASIS)."""
    start, end = day_bounds(day)
    rows: list[BatchUsage] = []
    arns: dict[str, str | None] = {}
    for batch_id in reader.closed_between(start, end):
        record = reader.batch(batch_id)
        if record is None:  # deleted after its retention since the listing
            continue
        arn = reader.execution_of(record) if reader.sfn is not None else None
        arns[batch_id] = arn
        rows.append(batch_usage(record, _name(arn)))
    executions = []
    for arn in sorted({a for a in arns.values() if a is not None}):
        executions.append(share_execution(reader, arn, rows))
    return DayUsage(day.isoformat(), rows, executions)


def _name(arn: str | None) -> str | None:
    return arn.rsplit(":", 1)[-1] if arn else None


def share_execution(reader: BucketReader, arn: str, day_rows: list[BatchUsage]) -> ExecutionShare:
    """Share the execution `arn`'s boot and hold among its batches (see BASIS); `day_rows` (those already read)
    get their shares in place."""
    try:
        described = reader.sfn.describe_execution(executionArn=arn)
    except reader.sfn.exceptions.ExecutionDoesNotExist:  # past Step Functions' 90 days: nothing to share
        return ExecutionShare(_name(arn) or arn, 0.0, None, 0.0, 0.0, 0.0, 0.0)
    started = _epoch(described["startDate"])
    stopped = _epoch(described["stopDate"]) if described.get("stopDate") else None
    name = _name(arn) or arn
    # Its batches closed on other days too: those closed while it ran (and within the hour after) are read.
    mine = {row.id: row for row in day_rows if row.execution == name}
    window_end = int((stopped if stopped is not None else reader.clock()) + CLOSE_AFTER_STOP_S)
    for batch_id in reader.closed_between(int(started), window_end):
        record = None if batch_id in mine else reader.batch(batch_id)
        if record is not None and _name(reader.execution_of(record)) == name:
            mine[batch_id] = batch_usage(record, name)
    marker = reader.json(f"{EXECUTIONS_PREFIX}{name}.json") or {}
    runs = int(marker["runs"]) if isinstance(marker.get("runs"), int) else None
    shared = share(list(mine.values()), name, started, stopped, reader.clock(), runs)
    if runs is not None:
        pools = {(reader.batch(b) or {}).get("_pool") or b for b in mine}
        shared.runs_unmatched = max(0, runs - len(pools))
    return shared


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()
