"""The batch records and their one change: compare-and-swap, counting each batch closed once.

Both halves of the API change batches: the service (create, cancel) and the scheduler (start, progress, finish,
expire). Both change them here, so a close is counted where the write that closed the batch won, once, however
many fronts race to close it: a try that lost its race is redone on the record read again and counts only if it
still closes it there. The counts (`take_closed`) are the queue's failed and expired metrics (queue_metrics.py).

It keeps the batches' indexes (batch_index.py) with the same writes: a create adds the batch to the open index
and the listing's order, a close adds it to the retention's queue and then removes it from the open index. So
`open` (the tick's, the quotas') reads the index and the open batches, and `page` reads one page.

With an outbox (events.py), every change of a batch's status records its event in the same write, and a batch
stays in the open index until its events are sent or given up (`settle`): the tick, which reads that index
anyway, finds what it has to send without a read of its own (`undelivered`: the closed ones among them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from workload.batch_api import events
from workload.batch_api.batch_index import STRAY_S, BatchIndex, order_id, ordered_batch_id, ordered_created_at
from workload.batch_api.models import BatchRecord
from workload.batch_api.objects import AT_RISK, ApiError, list_page, not_found
from workload.batch_api.records import Records, oldest_first
from workload.batch_api.tenants import sees


class BatchBook:
    def __init__(self, records: Records) -> None:
        self.records = records
        self.index = BatchIndex(records)
        # The open batches as the last `open` read them and this book's writes since left them: the tick's
        # metrics line (queue_metrics.py) counts them without reading the index and the batches a second time.
        self.known: dict[str, BatchRecord] | None = None
        self.closed: Counter[str] = Counter()  # since the front last took them (take_closed), by status written
        self.outbox = events.Outbox()  # off: no event recorded (the service turns it on: event_delivery.py)
        # Closed batches whose events are still to be sent, as the last `open` found them and writes since left them.
        self.undelivered: dict[str, BatchRecord] = {}

    def get(self, batch_id: str) -> BatchRecord | None:
        return self.records.get(BatchRecord, batch_id)

    def owned(self, owner: str, batch_id: str) -> BatchRecord:
        """The batch, if `owner` may see it; another tenant's id answers as an unknown one (ids cannot be probed)."""
        found = self.get(batch_id)
        if found is None or not sees(owner, found.owner):
            raise not_found("Batch", batch_id)
        return found

    def all(self) -> list[BatchRecord]:
        """Every batch, oldest first: a listing of them all, for the index's rebuild and the tests only."""
        return oldest_first(self.records.all(BatchRecord))

    def open(self) -> list[BatchRecord]:
        """Every batch not in a final status, oldest first: the index (one read) and each of them (one read each).
        Finishes what a close or a create left undone in the index (batch_index.py)."""
        now = self.records.now()
        found, stale = [], []
        self.undelivered = {}
        for batch_id, added in self.index.open_ids().items():
            record = self.get(batch_id)
            if record is None:
                if now >= added + STRAY_S:  # a create that died before writing its batch
                    stale.append(batch_id)
            elif record.closed and events.undelivered(record):  # kept in the index until its events are sent
                self.undelivered[batch_id] = record
            elif record.closed:  # a close that died before removing it
                self.index.finished(record)
                stale.append(batch_id)
            else:
                found.append(record)
        self.index.drop_open(stale)
        self.known = {record.id: record for record in found}
        return oldest_first(found)

    def open_as_left(self) -> list[BatchRecord]:
        """The open batches as the last `open` found them and this book's writes since left them (no read), or
        `open()` when none has been read."""
        return self.open() if self.known is None else oldest_first(self.known.values())

    def _known(self, record: BatchRecord) -> None:
        if self.known is not None:
            if record.closed:
                self.known.pop(record.id, None)
            else:
                self.known[record.id] = record

    def page(self, owner: str, after: str | None, limit: int) -> dict[str, Any]:
        """OpenAI's page of `owner`'s batches, newest first, after the batch `after`: one listing of the order
        markers and a read of each batch on it (one more, to say whether there are more, and one for `after`)."""
        start = None
        if after is not None:
            cursor = self.get(after)
            if cursor is None or not sees(owner, cursor.owner):
                raise ApiError(400, f"after: no batch {after!r} to page from", "after")
            start = order_id(cursor)
        shown: list[BatchRecord] = []
        first = True
        while len(shown) <= limit:
            asked = limit + 1 - len(shown)
            markers = self.index.newest(start, asked)
            if first and not markers and self.index.rebuilt_if_missing():  # batches from before the markers
                markers = self.index.newest(start, asked)
            first = False
            for marker in markers:
                start = marker
                record = self.get(ordered_batch_id(marker))
                # A marker whose batch is gone or differs is a create that died or was retried: not a batch.
                if record is not None and order_id(record) == marker:
                    if sees(owner, record.owner):
                        shown.append(record)
                elif self.records.now() >= ordered_created_at(marker) + STRAY_S:  # no create under way writes it
                    self.index.drop_listed(marker)
            if len(markers) < asked:  # the end of the listing
                break
        return list_page([record.public() for record in shown[:limit]], has_more=len(shown) > limit)

    def create(self, record: BatchRecord) -> None:
        """Write a new batch, in the indexes first (a create that dies between leaves an id the tick drops);
        StoreConflict if one with its id exists."""
        if self.outbox.on:
            record.events = [self._event(None, record)]
        if not record.closed or events.undelivered(record):
            self.index.add_open(record.id)
        self.index.listed(record)
        self.records.create(record)
        self._known(record)
        if record.closed:  # failed at create: its file holds no request, or too many
            self.index.finished(record)
            self.closed[record.status] += 1
            if events.undelivered(record):
                self.undelivered[record.id] = record

    def _event(self, previous: str | None, record: BatchRecord) -> dict[str, Any]:
        return events.entry(previous, record, self.records.now(), self.outbox.bus, self.outbox.webhooks)

    def update(self, batch_id: str, change: Callable[[BatchRecord], None]) -> BatchRecord:
        closing: list[str] = []

        def tracked(record: BatchRecord) -> None:
            was_open, before = not record.closed, record.status
            change(record)
            if self.outbox.on and record.status != before:  # its event, in the same write (events.py)
                record.events = [*(record.events or []), self._event(before, record)]
            closing[:] = [record.status] if was_open and record.closed else []
            if closing and record.llm_batch and AT_RISK in record.llm_batch:  # over: no longer at risk (at_risk.py)
                record.llm_batch = {k: v for k, v in record.llm_batch.items() if k != AT_RISK} or None

        written = self.records.update(BatchRecord, batch_id, tracked, not_found("Batch", batch_id))
        for status in closing:
            self.closed[status] += 1
        self._known(written)
        if closing:
            self.index.finished(written)
            if events.undelivered(written):  # stays in the open index until its events are sent (settle)
                self.undelivered[batch_id] = written
            else:
                self.index.drop_open([batch_id])
        return written

    def settle(self, batch_id: str, change: Callable[[BatchRecord], None]) -> BatchRecord:
        """Write where a batch's events stand after the tick's sends (`change` sets them on the record read
        again); a closed batch with nothing left to send leaves the open index."""
        written = self.update(batch_id, change)
        if written.closed and not events.undelivered(written):
            self.undelivered.pop(batch_id, None)
            self.index.finished(written)  # again: a close that died before it (a marker written once)
            self.index.drop_open([batch_id])
        elif written.closed:
            self.undelivered[batch_id] = written
        return written

    def with_events(self) -> list[BatchRecord]:
        """The batches with an event still to send, open and closed, as the last `open` and the writes since left
        them (no read)."""
        return [r for r in (*self.open_as_left(), *self.undelivered.values()) if events.undelivered(r)]

    def take_closed(self) -> Counter[str]:
        """The batches closed since the last call, by status; the count starts again from zero."""
        taken, self.closed = self.closed, Counter()
        return taken
