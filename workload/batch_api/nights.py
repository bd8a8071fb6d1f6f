"""The night as one more entry of the Batch API's queue, so the nightly schedule never races a batch's run.

With the Batch API on, the nightly schedule invokes the tick function with `{"enqueue_night": <scheduled time>}`
in place of starting the state machine: `enqueue` records a `night` entry (records/night/night-<date>.json), and
the queue starts it like any batch, oldest first: at once when nothing runs (its own execution, the schedule's
`{"date": ...}` input), or as the next run of the execution that holds the GPUs (its NextBatch step). The run
is the night's as before: PlanRun's date path, the _READY check and the skip, retries on interruption, resume on
the same output, the alerts and the sweep; its input is read from S3 by the job, so no upload limit applies.

Entries are the stack's, not a key's: they are records of their own kind, which no batch listing reads, so API
keys never see them; operators read them in the bucket (`batch-api/records/night/`). An entry is `queued`, then
`started` (with the execution that took it); how the night went is that execution's, as it always was. The
schedule may deliver twice (its retries): one entry per date, the second enqueue is a no-op.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workload.batch_api.objects import ApiError
from workload.batch_api.store import StoreConflict, update_record

if TYPE_CHECKING:
    from workload.batch_api.service import BatchService

KIND = "night"
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def entry_id(date: str) -> str:
    return f"night-{date}"


def enqueue(service: BatchService, scheduled_time: str) -> dict[str, Any]:
    """Queue the night of `scheduled_time` (EventBridge Scheduler's `<aws.scheduler.scheduled-time>`, UTC, or a
    bare date); the entry (the one already queued for that date, if any)."""
    found = _DATE.match(str(scheduled_time))
    if found is None:
        raise ApiError(400, f"enqueue_night: {scheduled_time!r} is not a UTC time or date (YYYY-MM-DD...)")
    date = found.group(0)
    record: dict[str, Any] = {
        "id": entry_id(date),
        "object": "night",
        "date": date,
        "status": "queued",
        "created_at": service.now(),
        "_seq": service._seq(),
        "execution_arn": None,
    }
    try:
        service.store.put(KIND, record, None)
    except StoreConflict:  # the schedule's retry, or a rerun of the same date: one entry per night
        existing = service.store.get(KIND, record["id"])
        return existing.record if existing is not None else record
    return record


def queued(service: BatchService) -> list[dict[str, Any]]:
    return [r for r in service.store.records(KIND) if r["status"] == "queued"]


def claim(service: BatchService, night_id: str, execution_arn: str | None) -> bool:
    """Mark the entry started by `execution_arn` if it is still queued (compare-and-swap); whether it was."""
    found = service.store.get(KIND, night_id)
    if found is None or found.record["status"] != "queued":
        return False
    record = {**found.record, "status": "started", "started_at": service.now(), "execution_arn": execution_arn}
    try:
        service.store.put(KIND, record, found.version)
    except StoreConflict:  # taken by another tick or execution since it was read
        return False
    return True


def sweep(service: BatchService, now: int) -> None:
    """Started entries go after the retention, as finished batches do."""
    for record in service.store.records(KIND):
        if record["status"] == "started" and now >= record.get("started_at", now) + service.limits.retention_s:
            service.store.delete(KIND, record["id"])


def unclaim(service: BatchService, night_id: str) -> None:
    """Back to `queued`: its start found the GPUs taken after all (the execution that holds them takes it)."""

    def requeue(record: dict[str, Any]) -> None:
        if record["status"] == "started" and record["execution_arn"] is None:
            record["status"] = "queued"

    _change(service, night_id, requeue)


def started_by(service: BatchService, night_id: str, execution_arn: str) -> None:
    _change(service, night_id, lambda record: record.update(execution_arn=execution_arn))


class _Gone(LookupError):
    """The entry went (swept) before the change: nothing to change."""


def _change(service: BatchService, night_id: str, change: Callable[[dict[str, Any]], None]) -> None:
    # The store's compare-and-swap loop (bounded, re-read on a lost race), as the batches' changes use.
    with contextlib.suppress(_Gone):
        update_record(service.store, KIND, night_id, change, _Gone(night_id))
