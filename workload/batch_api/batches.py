"""The batch records and their one change: compare-and-swap, counting each batch closed once.

Both halves of the API change batches: the service (create, cancel) and the scheduler (start, progress, finish,
expire). Both change them here, so a close is counted where the write that closed the batch won, once, however
many fronts race to close it: a try that lost its race is redone on the record read again and counts only if it
still closes it there. The counts (`take_closed`) are the queue's failed and expired metrics (queue_metrics.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from workload.batch_api.models import BatchRecord
from workload.batch_api.objects import not_found
from workload.batch_api.records import Records, oldest_first


class BatchBook:
    def __init__(self, records: Records) -> None:
        self.records = records
        self.closed: Counter[str] = Counter()  # since the front last took them (take_closed), by status written

    def get(self, batch_id: str) -> BatchRecord | None:
        return self.records.get(BatchRecord, batch_id)

    def owned(self, owner: str, batch_id: str) -> BatchRecord:
        """The batch, if `owner` may see it; another tenant's id answers as an unknown one (ids cannot be probed)."""
        found = self.get(batch_id)
        if found is None or found.owner != owner:
            raise not_found("Batch", batch_id)
        return found

    def all(self) -> list[BatchRecord]:
        """Every batch, oldest first."""
        return oldest_first(self.records.all(BatchRecord))

    def create(self, record: BatchRecord) -> None:
        self.records.create(record)
        if record.closed:  # failed at create: its file holds no request, or too many
            self.closed[record.status] += 1

    def update(self, batch_id: str, change: Callable[[BatchRecord], None]) -> BatchRecord:
        closing: list[str] = []

        def tracked(record: BatchRecord) -> None:
            was_open = not record.closed
            change(record)
            closing[:] = [record.status] if was_open and record.closed else []

        written = self.records.update(BatchRecord, batch_id, tracked, not_found("Batch", batch_id))
        for status in closing:
            self.closed[status] += 1
        return written

    def take_closed(self) -> Counter[str]:
        """The batches closed since the last call, by status; the count starts again from zero."""
        taken, self.closed = self.closed, Counter()
        return taken
