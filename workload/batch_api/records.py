"""The records layer: the one way the Batch API's modules read and change what the store keeps.

It holds what every change needs in one place: the store, the clock (injected, so tests move time), the sequence
that orders records made within one second, and the compare-and-swap update. Records go in and out typed
(models.py); the store below speaks JSON dicts (store.py), so both stores keep the layout they always had.

Every change is `update`: read, apply the change to the typed record, write it back only if nobody wrote in
between (store.update_record's bounded loop), else read again and redo it. Two fronts (two Lambda invocations,
or a front and the scheduled tick) changing one record never lose each other's write.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from workload.batch_api.models import Record
from workload.batch_api.store import Store, update_record

R = TypeVar("R", bound=Record)
_ORDER = itertools.count()


def oldest_first(records: Iterable[R]) -> list[R]:
    """By creation, then by sequence (created_at has a second's resolution): the queue's order and the pages'."""
    return sorted(records, key=lambda record: (record.created_at, record.seq))


class Records:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock

    def now(self) -> int:
        return int(self.clock())

    def seq(self) -> int:
        # Orders records created within one second: oldest first, and a stable cursor for the pages.
        return time.time_ns() * 1000 + next(_ORDER) % 1000

    def get(self, model: type[R], object_id: str) -> R | None:
        found = self.store.get(model.KIND, object_id)
        return None if found is None else model.load(found.record)

    def all(self, model: type[R]) -> list[R]:
        return [model.load(stored) for stored in self.store.records(model.KIND)]

    def create(self, record: Record) -> None:
        """Write a new record; StoreConflict if one with its id exists."""
        self.store.put(record.KIND, record.stored(), None)

    def delete(self, model: type[Record], object_id: str) -> None:
        self.store.delete(model.KIND, object_id)

    def update(self, model: type[R], object_id: str, change: Callable[[R], None], missing: Exception) -> R:
        """Apply `change` to the stored record by compare-and-swap; the record as written. `missing` is raised if
        it is gone; an exception from `change` leaves the record as it was."""

        def on_stored(stored: dict[str, Any]) -> None:
            record = model.load(stored)
            change(record)
            stored.clear()
            stored.update(record.stored())

        return model.load(update_record(self.store, model.KIND, object_id, on_stored, missing))
