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
schedule may deliver twice (its retries): one entry per date, the second enqueue is a no-op. An entry claimed for a
start that never named its execution (the tick died, or the start failed, between the two) is found again by the
tick after START_S: given its execution if one was started under its name, else queued again. The scheduler is the
only user: it queues, claims and sweeps entries here, and starts their runs through the executor.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable

from workload.batch_api.models import NightEntry
from workload.batch_api.objects import ApiError
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
# How long a night claimed for its own start may go without its execution's ARN before the tick looks for it
# (a start takes a second or two; a Lambda that dies mid-tick never returns).
START_S = 120


def entry_id(date: str) -> str:
    return f"night-{date}"


class _Gone(LookupError):
    """The entry went (swept) before the change: nothing to change."""


class Nights:
    def __init__(self, records: Records, retention_s: int) -> None:
        self.records, self.retention_s = records, retention_s

    def enqueue(self, scheduled_time: str) -> NightEntry:
        """Queue the night of `scheduled_time` (EventBridge Scheduler's `<aws.scheduler.scheduled-time>`, UTC, or a
        bare date); the entry (the one already queued for that date, if any)."""
        found = _DATE.match(str(scheduled_time))
        if found is None:
            raise ApiError(400, f"enqueue_night: {scheduled_time!r} is not a UTC time or date (YYYY-MM-DD...)")
        date = found.group(0)
        entry = NightEntry(id=entry_id(date), date=date, created_at=self.records.now(), seq=self.records.seq())
        try:
            self.records.create(entry)
        except StoreConflict:  # the schedule's retry, or a rerun of the same date: one entry per night
            return self.records.get(NightEntry, entry.id) or entry
        return entry

    def queued(self) -> list[NightEntry]:
        return [entry for entry in self.records.all(NightEntry) if entry.status == "queued"]

    def claim(self, night_id: str, execution_arn: str | None) -> bool:
        """Mark the entry started by `execution_arn` if it is still queued (compare-and-swap); whether it was."""

        def start(entry: NightEntry) -> None:
            if entry.status != "queued":
                raise StoreConflict("taken")
            entry.status, entry.started_at, entry.execution_arn = "started", self.records.now(), execution_arn

        try:
            self.records.update(NightEntry, night_id, start, _Gone(night_id))
        except (StoreConflict, _Gone):  # taken by another tick or execution since it was read, or gone
            return False
        return True

    def stranded(self, now: int) -> list[NightEntry]:
        """Entries claimed for a start of their own that never named its execution within START_S: the tick
        died, or the start failed or lost its reply, between the claim and `started_by`."""
        return [
            entry
            for entry in self.records.all(NightEntry)
            if entry.status == "started" and entry.execution_arn is None and now >= (entry.started_at or 0) + START_S
        ]

    def unclaim(self, night_id: str) -> None:
        """Back to `queued`: its start found the GPUs taken after all (the execution that holds them takes it)."""

        def requeue(entry: NightEntry) -> None:
            if entry.status == "started" and entry.execution_arn is None:
                entry.status = "queued"

        self._change(night_id, requeue)

    def started_by(self, night_id: str, execution_arn: str) -> None:
        def name(entry: NightEntry) -> None:
            entry.execution_arn = execution_arn

        self._change(night_id, name)

    def sweep(self, now: int) -> None:
        """Started entries go after the retention, as finished batches do."""
        for entry in self.records.all(NightEntry):
            if entry.status == "started" and now >= (entry.started_at or now) + self.retention_s:
                self.records.delete(NightEntry, entry.id)

    def _change(self, night_id: str, change: Callable[[NightEntry], None]) -> None:
        with contextlib.suppress(_Gone):
            self.records.update(NightEntry, night_id, change, _Gone(night_id))
