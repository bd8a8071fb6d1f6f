"""The batches' three indexes in the store, so nothing that runs often reads every batch (issue 61).

- the open-batches index, `records/control/open-batches.json`: the id of every batch not yet in a final status,
  with when it was added. The tick reads it (one GET) and then each open batch (one GET each), never a listing of
  the batches. It is changed by compare-and-swap like any record (records.py), so two writers never lose each
  other's change. S3 has no transaction over two objects, so it is kept a superset of the open batches: a create
  adds the id before it writes the batch, a close writes the batch, then its `batch_done` marker, then removes
  the id; whoever reads an id whose batch is closed (or, after STRAY_S, missing) finishes that removal. Lost (or
  before the first tick after an upgrade), it is rebuilt once from a listing of the batches.
- `records/batch_order/<order id>.json`: an empty marker per batch whose id sorts newest first (created_at, then
  the sequence, both inverted), so `GET /v1/batches` (and `infra.status --batches`) list one page of markers
  (S3's ListObjectsV2 with StartAfter and MaxKeys) and read only that page's batches. A marker whose batch is
  missing or differs (a create that died, or was retried with another created_at) is dropped by the page that
  finds it after STRAY_S, so dead markers do not pile up in every page's reads.
- `records/batch_done/<done_at>.<batch id>.json`: a marker per finished batch, oldest finish first, so the
  retention deletes the batches past it a bounded number a tick, oldest first, with one listing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import ClassVar

from pydantic import Field

from workload.batch_api import events
from workload.batch_api.models import BatchRecord, Record
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict

ORDER_KIND, DONE_KIND = "batch_order", "batch_done"
OPEN_ID = "open-batches"
# An id in the index whose batch does not exist is a create under way (it adds the id before it writes the batch)
# or one that died between the two; a create takes at most the front's 29 s, so after an hour it is the latter.
STRAY_S = 3600
WRITERS = 16  # markers a rebuild writes at once (as S3Store reads records: READERS)
_CREATED_DIGITS, _SEQ_DIGITS = 10, 23  # created_at in seconds and records.seq (nanoseconds * 1000), inverted


class OpenBatches(Record):
    """The open-batches index: batch id -> when it was added (records/control/open-batches.json)."""

    KIND: ClassVar[str] = "control"

    open: dict[str, int] = Field(default_factory=dict)


class _Missing(Exception):
    """The index is not in the store (lost, or never written before this version)."""


def order_id(record: Record) -> str:
    """The batch's marker in `batch_order`: sorts newest first, as OpenAI lists batches."""
    created, seq = 10**_CREATED_DIGITS - 1 - record.created_at, 10**_SEQ_DIGITS - 1 - record.seq
    if created < 0 or seq < 0 or record.created_at < 0 or record.seq < 0:
        raise ValueError(f"batch {record.id}: created_at {record.created_at} or _seq {record.seq} out of range")
    return f"{created:0{_CREATED_DIGITS}d}.{seq:0{_SEQ_DIGITS}d}.{record.id}"


def ordered_batch_id(marker: str) -> str:
    return marker.split(".", 2)[2]


def ordered_created_at(marker: str) -> int:
    """The created_at the marker `marker` was written for."""
    return 10**_CREATED_DIGITS - 1 - int(marker.split(".", 1)[0])


def done_id(batch_id: str, done_at: int) -> str:
    return f"{done_at:0{_CREATED_DIGITS}d}.{batch_id}"


class BatchIndex:
    def __init__(self, records: Records) -> None:
        self.records, self.store = records, records.store

    # ---- the open batches --------------------------------------------------------------------------------------

    def open_ids(self) -> dict[str, int]:
        """Every open batch's id (and maybe a few closed or stray ones, see above), with when it was added."""
        found = self.records.get(OpenBatches, OPEN_ID)
        return dict((found or self.rebuild()).open)

    def rebuilt_if_missing(self) -> bool:
        """Rebuild the index (and the markers) if it was never written: a store of batches made before it has no
        markers at all, so a listing that finds none asks this once (one GET) before it answers empty."""
        if self.records.get(OpenBatches, OPEN_ID) is not None:
            return False
        self.rebuild()
        return True

    def add_open(self, batch_id: str) -> None:
        now = self.records.now()

        def add(index: OpenBatches) -> None:
            index.open.setdefault(batch_id, now)

        self._change(add)

    def drop_open(self, batch_ids: Iterable[str]) -> None:
        gone = set(batch_ids)

        def drop(index: OpenBatches) -> None:
            for batch_id in gone:
                index.open.pop(batch_id, None)

        if gone:
            self._change(drop)

    def _change(self, change: Callable[[OpenBatches], None]) -> None:
        for _ in range(2):
            try:
                self.records.update(OpenBatches, OPEN_ID, change, _Missing())
                return
            except _Missing:
                self.rebuild()
        raise StoreConflict("the open-batches index vanished twice while it was being changed")

    def rebuild(self) -> OpenBatches:
        """The index made again from a listing of every batch (and the markers a batch lacks: an upgrade's
        first run, or a lost index), written only if none was written meanwhile; the index as stored."""
        batches = self.records.all(BatchRecord)
        index = OpenBatches(id=OPEN_ID, created_at=self.records.now(), seq=0)
        # A closed batch with an event still to send stays in it until the tick has sent it (batches.py).
        index.open = {
            record.id: self.records.now() for record in batches if not record.closed or events.undelivered(record)
        }
        ordered, done = self._all_ids(ORDER_KIND), self._all_ids(DONE_KIND)
        marks = [partial(self.listed, record) for record in batches if order_id(record) not in ordered]
        marks += [
            partial(self.finished, record)
            for record in batches
            if record.closed and record.done_at is not None and done_id(record.id, record.done_at) not in done
        ]
        # An upgrade over months of batches writes two markers each: WRITERS at once keep it inside one tick's
        # timeout (a tick that dies first leaves the markers it wrote, and the next writes only the rest).
        with ThreadPoolExecutor(max_workers=WRITERS) as pool:
            list(pool.map(lambda mark: mark(), marks))
        try:
            self.records.create(index)
        except StoreConflict:  # another writer rebuilt it first; its index, and any add since, stands
            return self.records.get(OpenBatches, OPEN_ID) or index
        return index

    def _all_ids(self, kind: str) -> set[str]:
        found: set[str] = set()
        after = None
        while page := self.store.ids(kind, after, 1000):
            found.update(page)
            after = page[-1]
        return found

    # ---- the markers -------------------------------------------------------------------------------------------

    def listed(self, record: BatchRecord) -> None:
        """Its place in the listing (idempotent: a retry writes the same marker)."""
        self._mark(ORDER_KIND, order_id(record), record.id)

    def finished(self, record: BatchRecord) -> None:
        """Its place in the retention's queue, once it is closed (idempotent)."""
        if record.done_at is not None:
            self._mark(DONE_KIND, done_id(record.id, record.done_at), record.id)

    def _mark(self, kind: str, marker: str, batch_id: str) -> None:
        with contextlib.suppress(StoreConflict):  # written before: the same marker
            self.store.put(kind, {"id": marker, "batch": batch_id}, None)

    def drop_listed(self, marker: str) -> None:
        """Remove a stray order marker (one whose batch is missing or differs, see above)."""
        self.store.delete(ORDER_KIND, marker)

    def newest(self, after: str | None, limit: int) -> list[str]:
        """One listing: the order markers after the marker `after`, newest batch first."""
        return self.store.ids(ORDER_KIND, after, limit)

    def done_by(self, cutoff: int, limit: int) -> list[tuple[str, str]]:
        """One listing: (marker, batch id) of at most `limit` batches finished at or before `cutoff`, oldest
        finish first."""
        due = []
        for marker in self.store.ids(DONE_KIND, None, limit):
            done_at, _, batch_id = marker.partition(".")
            if int(done_at) > cutoff:
                break
            due.append((marker, batch_id))
        return due
