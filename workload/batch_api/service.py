"""The Batch API's rules, with no HTTP and no engine in them: what the routes do, and how a batch moves on.

The routes (app.py) call the first half: upload, list, read and delete files; create, read, list and cancel
batches. Every record carries its owner (`_owner`); a caller sees only records with the owner its key maps to
(app.py decides the mapping: one project for every key, as OpenAI's keys of one project, or one tenant per key).

`tick()` is the second half, called every second by the local server (and by the tiers' scheduler there): it
expires and deletes what is past its time, follows the batch that runs, and starts the oldest queued batch when
none runs and the executor is not `occupied` (on the tiers an execution holding the GPUs takes the queue itself:
scheduler.next_run). Statuses are OpenAI's:

    validating --(its turn: the executor starts the job)--> in_progress --(every request answered)--> finalizing
        --(the job wrote its files)--> completed
    validating --(the file has no request, or too many)--> failed (errors.data says why)
    in_progress --(the job failed)--> failed (errors.data: the job's one-line reason; partial files kept)
    any open status --(cancel)--> cancelling --(the job stopped and committed what finished)--> cancelled
    any open status --(expires_at passed)--> expired (the job is stopped the same way; its finished part kept)

A queued batch is `validating` until its turn (OpenAI's batches also sit in `validating` until they start).
Every change is a compare-and-swap on the record's version (`_update`), so two fronts (or a front and the
scheduler) changing one batch never lose each other's write; the change that closes a batch is counted where its
write wins (`closed`), once, for the queue's metrics (queue_metrics.py).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from workload.batch_api.executor import BatchRun, Executor
from workload.batch_api.objects import (
    COMPLETION_WINDOWS,
    EXPIRES_AFTER_RANGE_S,
    METADATA_KEY_CHARS,
    METADATA_PAIRS,
    METADATA_VALUE_CHARS,
    TERMINAL,
    UPLOAD_PURPOSES,
    ApiError,
    Limits,
    batch_errors,
    batch_record,
    file_record,
    list_page,
    new_id,
    not_found,
    public,
)
from workload.batch_api.store import Store, update_record

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")  # what the job answers (workload/files/openai_batch.py)
_ORDER = itertools.count()


def _sort_key(record: dict[str, Any]) -> tuple[int, int]:
    return record["created_at"], record["_seq"]


class BatchService:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        model: str,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.executor, self.model = store, executor, model
        self.limits = limits or Limits()
        self.clock = clock
        # Batches this service closed, by the status it wrote, since the front last took them (`take_closed`): the
        # queue's failed/expired counts (queue_metrics.py). Counted where the write that closed one won, so a batch
        # is counted once however many fronts race to close it.
        self.closed: Counter[str] = Counter()

    def now(self) -> int:
        return int(self.clock())

    def _seq(self) -> int:
        # Orders records created within one second (created_at's resolution): oldest first, and a stable cursor.
        return time.time_ns() * 1000 + next(_ORDER) % 1000

    # ---- files -------------------------------------------------------------------------------------------------

    def upload_file(
        self, owner: str, filename: str, purpose: str, chunks: Iterable[bytes], expires_after_s: int | None = None
    ) -> dict[str, Any]:
        if purpose not in UPLOAD_PURPOSES:
            raise ApiError(400, f"purpose {purpose!r} not served here; upload batch input as 'batch'", "purpose")
        if expires_after_s is not None and not EXPIRES_AFTER_RANGE_S[0] <= expires_after_s <= EXPIRES_AFTER_RANGE_S[1]:
            low, high = EXPIRES_AFTER_RANGE_S
            raise ApiError(400, f"expires_after.seconds must be between {low} and {high}", "expires_after.seconds")
        file_id = new_id("file")
        key = f"files/{file_id}.jsonl"
        size = self.store.write_blob(key, self._capped(chunks))
        created = self.now()
        keep = min(expires_after_s or self.limits.retention_s, self.limits.retention_s)
        record = file_record(
            file_id, filename, purpose, size, created, created + keep, owner=owner, seq=self._seq(), key=key
        )
        self.store.put("file", record, None)
        return public(record)

    def _capped(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > self.limits.max_file_bytes:
                raise ApiError(
                    413, f"the file is larger than this server's limit of {self.limits.max_file_bytes} bytes", "file"
                )
            yield chunk

    def _file(self, owner: str, file_id: str) -> dict[str, Any]:
        found = self.store.get("file", file_id)
        if found is None or found.record["_owner"] != owner:
            raise not_found("File", file_id)
        return found.record

    def get_file(self, owner: str, file_id: str) -> dict[str, Any]:
        return public(self._file(owner, file_id))

    def file_content(self, owner: str, file_id: str) -> Iterator[bytes]:
        record = self._file(owner, file_id)
        body = self.store.read_blob(record["_key"])
        if body is None:
            raise not_found("File", file_id)
        return body

    def file_redirect(self, owner: str, file_id: str) -> str | None:
        """Where to send a download too large for the front (`Limits.inline_download_bytes`); None: answer inline."""
        record = self._file(owner, file_id)
        presign = getattr(self.store, "download_url", None)
        inline = self.limits.inline_download_bytes
        if presign is None or inline is None or record["bytes"] <= inline:
            return None
        return str(presign(record["_key"]))

    def delete_file(self, owner: str, file_id: str) -> dict[str, Any]:
        record = self._file(owner, file_id)
        self.store.delete("file", file_id)
        self.store.delete_blobs(record["_key"])
        return {"id": file_id, "object": "file", "deleted": True}

    def list_files(self, owner: str, after: str | None, limit: int, order: str, purpose: str | None) -> dict[str, Any]:
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order must be 'asc' or 'desc', got {order!r}", "order")
        mine = [r for r in self.store.records("file") if r["_owner"] == owner and purpose in (None, r["purpose"])]
        return _page(mine, after, _limit(limit, 10_000), descending=order == "desc")

    # ---- batches -----------------------------------------------------------------------------------------------

    def create_batch(
        self,
        owner: str,
        input_file_id: Any,
        endpoint: Any,
        completion_window: Any,
        metadata: Any = None,
    ) -> dict[str, Any]:
        if not isinstance(input_file_id, str) or not input_file_id:
            raise ApiError(400, "input_file_id is required", "input_file_id")
        if endpoint not in ENDPOINTS:
            raise ApiError(
                400, f"endpoint {endpoint!r} is not served here; use one of {', '.join(ENDPOINTS)}", "endpoint"
            )
        if completion_window not in COMPLETION_WINDOWS:
            raise ApiError(400, f"completion_window must be '24h', got {completion_window!r}", "completion_window")
        _check_metadata(metadata)
        found = self.store.get("file", input_file_id)
        if found is None or found.record["_owner"] != owner:
            raise not_found("File", input_file_id, "input_file_id")
        if found.record["purpose"] != "batch":
            raise ApiError(
                400,
                f"file {input_file_id} has purpose {found.record['purpose']!r}; a batch needs 'batch'",
                "input_file_id",
            )
        batch_id = new_id("batch")
        record = batch_record(
            batch_id,
            input_file_id,
            endpoint,
            completion_window,
            self.now(),
            metadata,
            self.model,
            owner=owner,
            seq=self._seq(),
            input_key=found.record["_key"],
            output_key=f"batches/{batch_id}/output",
            stop=None,
        )
        problems, total = self._validate_input(found.record["_key"])
        record["request_counts"]["total"] = total
        if problems:
            failed_at = record["created_at"]
            record.update(status="failed", failed_at=failed_at, errors=batch_errors(problems), _done_at=failed_at)
        self.store.put("batch", record, None)
        if problems:
            self.closed["failed"] += 1
        return public(record)

    def _validate_input(self, key: str) -> tuple[list[dict[str, Any]], int]:
        """What fails a batch before it runs (OpenAI's batch-level errors); a bad line is the job's error line."""
        body = self.store.read_blob(key)
        if body is None:
            return [{"code": "file_not_found", "message": "the input file's content is gone"}], 0
        total, tail = 0, b""
        for chunk in body:
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            total += sum(1 for line in lines if line.strip())
        total += 1 if tail.strip() else 0
        if total == 0:
            return [{"code": "empty_file", "message": "the input file holds no request"}], 0
        if total > self.limits.max_requests:
            message = f"the input file holds {total} requests; a batch takes at most {self.limits.max_requests}"
            return [{"code": "too_many_requests", "message": message}], total
        return [], total

    def _batch(self, owner: str, batch_id: str) -> dict[str, Any]:
        found = self.store.get("batch", batch_id)
        if found is None or found.record["_owner"] != owner:
            raise not_found("Batch", batch_id)
        return found.record

    def get_batch(self, owner: str, batch_id: str) -> dict[str, Any]:
        return public(self._batch(owner, batch_id))

    def list_batches(self, owner: str, after: str | None, limit: int) -> dict[str, Any]:
        mine = [r for r in self.store.records("batch") if r["_owner"] == owner]
        return _page(mine, after, _limit(limit, 100), descending=True)

    def cancel_batch(self, owner: str, batch_id: str) -> dict[str, Any]:
        self._batch(owner, batch_id)

        def cancel(record: dict[str, Any]) -> None:
            if record["status"] in TERMINAL or record["status"] == "cancelling":
                raise ApiError(409, f"batch {batch_id} is {record['status']}; it cannot be cancelled", "batch_id")
            now = self.now()
            if record["status"] == "validating":  # queued: nothing runs, nothing to stop
                record.update(status="cancelled", cancelling_at=now, cancelled_at=now, _done_at=now)
            else:
                record.update(status="cancelling", cancelling_at=now, _stop="cancelled")

        record = self._update(batch_id, cancel)
        if record["status"] == "cancelling":
            self.executor.stop(batch_id)
        return public(record)

    def _update(self, batch_id: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Apply `change` to the stored batch by compare-and-swap; the record as written. A change that closes
        the batch is counted in `closed` once it is the one written (a try that lost its race is redone on the
        record read again, and counts only if it still closes it there)."""
        closing: list[str] = []

        def tracked(record: dict[str, Any]) -> None:
            before = record["status"]
            change(record)
            closing[:] = [record["status"]] if record["status"] != before and record["status"] in TERMINAL else []

        written = update_record(self.store, "batch", batch_id, tracked, not_found("Batch", batch_id))
        for status in closing:
            self.closed[status] += 1
        return written

    def take_closed(self) -> Counter[str]:
        """The batches closed since the last call, by status; the count starts again from zero."""
        taken, self.closed = self.closed, Counter()
        return taken

    # ---- the scheduler -----------------------------------------------------------------------------------------

    def tick(self) -> None:
        from workload.batch_api import scheduler

        scheduler.tick(self)


def _limit(limit: int, most: int) -> int:
    if not 1 <= limit <= most:
        raise ApiError(400, f"limit must be between 1 and {most}, got {limit}", "limit")
    return limit


def _page(records: list[dict[str, Any]], after: str | None, limit: int, descending: bool) -> dict[str, Any]:
    ordered = sorted(records, key=_sort_key, reverse=descending)
    if after is not None:
        ids = [r["id"] for r in ordered]
        if after not in ids:
            raise ApiError(400, f"after: no object {after!r} to page from", "after")
        ordered = ordered[ids.index(after) + 1 :]
    return list_page([public(r) for r in ordered[:limit]], has_more=len(ordered) > limit)


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ApiError(400, "metadata must be an object of string values", "metadata")
    if len(metadata) > METADATA_PAIRS:
        raise ApiError(400, f"metadata holds {len(metadata)} pairs; at most {METADATA_PAIRS}", "metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
            raise ApiError(
                400,
                f"metadata key {key[:20]!r}: keys take at most {METADATA_KEY_CHARS} characters, "
                f"values {METADATA_VALUE_CHARS}",
                "metadata",
            )


__all__ = ["ENDPOINTS", "BatchRun", "BatchService"]
