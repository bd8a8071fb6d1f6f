"""The Batch API's one surface: what the routes (app.py), the Lambda front (lambda_front.py) and the local
server's ticker (cli.py) call, with no HTTP and no engine in it.

The first half answers the routes: files (files.py), uploads (uploads.py), and batches: create, read, list,
cancel (here). Every record carries its owner; a caller sees only records with the owner its key maps to (app.py
decides the mapping: one project for every key, as OpenAI's keys of one project, or one tenant per key).

The second half is the scheduler's (scheduler.py), called every second by the local server and by the tiers'
schedule and state machine there: `tick` expires and deletes what is past its time, follows the batch that runs,
and starts the first queued batch (by priority, then the end of its window: priorities.py) when none runs and the
executor is not `occupied` (on the tiers an execution holding the GPUs takes the queue itself: `next_run`).
Statuses are OpenAI's:

    validating --(its turn: the executor starts the job)--> in_progress --(every request answered)--> finalizing
        --(the job wrote its files)--> completed
    validating --(the file has no request, or too many)--> failed (errors.data says why)
    in_progress --(the job failed)--> failed (errors.data: the job's one-line reason; partial files kept)
    any open status --(cancel)--> cancelling --(the job stopped and committed what finished)--> cancelled
    any open status --(expires_at passed)--> expired (the job is stopped the same way; its finished part kept)

A queued batch is `validating` until its turn (OpenAI's batches also sit in `validating` until they start).
Every change goes through the records layer's compare-and-swap (records.py), batches through `BatchBook`
(batches.py), which counts each close once, where its write won, for the queue's metrics (queue_metrics.py).
The scheduler is the executor's only caller: a cancel asks it to stop the run.

Layers inside the package, each importing only those below it: service -> scheduler -> uploads -> files ->
paging, batches, nights, idempotency -> records -> models -> objects; the store (store.py, s3_store.py) and the
executor (executor.py, sfn_executor.py) are handed in by the front that builds the service.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from workload.batch_api import vision
from workload.batch_api.batches import BatchBook
from workload.batch_api.event_delivery import EventConfig, EventSender
from workload.batch_api.executor import Executor
from workload.batch_api.files import Files
from workload.batch_api.idempotency import Claims, check_key, params_hash
from workload.batch_api.models import BatchRecord, FileRecord
from workload.batch_api.objects import (
    COMPLETION_WINDOWS,
    METADATA_KEY_CHARS,
    METADATA_PAIRS,
    METADATA_VALUE_CHARS,
    ApiError,
    Limits,
    batch_errors,
    new_id,
)
from workload.batch_api.paging import checked_limit
from workload.batch_api.pools import PoolSettings
from workload.batch_api.priorities import asked_priority
from workload.batch_api.quotas import Holdings, Quotas, check_request_bounds
from workload.batch_api.records import Records
from workload.batch_api.scheduler import Scheduler
from workload.batch_api.store import Store, StoreConflict
from workload.batch_api.uploads import Uploads
from workload.contract.jsonl_lines import request_lines

# What the job answers (workload/files/openai_batch.py URLS): an embeddings batch runs the job's embed task
# (docs/job.md, "Embeddings"), chosen by the input's url, locally and on the AWS front alike; a responses batch is
# answered through the chat path (docs/job.md, "Responses").
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


class BatchService:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        model: str,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
        served_models: tuple[str, ...] = (),
        pool_settings: PoolSettings | None = None,
        events: EventConfig | None = None,
    ) -> None:
        self.store, self.executor, self.model = store, executor, model
        # What a line's `model` may name (GET /v1/models): the model, its aliases and its LoRA adapters (issue 57).
        self.served_models = served_models or (model,)
        self.limits = limits or Limits()
        self.records = Records(store, clock)
        self.claims = Claims(self.records)
        self.batches = BatchBook(self.records)
        self.files = Files(self.records, self.limits)
        self.uploads = Uploads(self.records, self.files)
        self.quotas = quotas or Quotas()
        self.scheduler = Scheduler(
            self.records, self.batches, executor, self.files, self.uploads, self.quotas, pool_settings
        )
        # What a cancel calls to stop the batch's run: the scheduler's stop here; on AWS the internet-facing
        # function may not stop executions (issue 60), so its cancel hands the stop to the tick (lambda_front.py).
        self.stop_run: Callable[[str], None] = self.scheduler.stop
        self.holdings = Holdings(self.records, self.batches, self.quotas)
        # Each status change's event, written with it and sent by the tick (events.py, event_delivery.py).
        self.events: EventSender | None = None
        if events is not None and events.outbox.on:
            self.batches.outbox = events.outbox
            self.events = EventSender(
                self.batches, events.stack, events.bus, events.hooks, events.retry, events.post, events.wall
            )

    @property
    def clock(self) -> Callable[[], float]:
        return self.records.clock

    def now(self) -> int:
        return self.records.now()

    def list_models(self) -> dict[str, Any]:
        """OpenAI's model list (GET /v1/models): every name a batch's lines may give as `model`. `created` is 0:
        the names come from the job's config, which records no creation time."""
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "llm-batch"} for name in self.served_models]
        return {"object": "list", "data": data}

    # ---- files -------------------------------------------------------------------------------------------------

    def upload_file(
        self, owner: str, filename: str, purpose: str, chunks: Iterable[bytes], expires_after_s: int | None = None
    ) -> dict[str, Any]:
        room = self.holdings.file_room(owner)
        return self.files.upload(owner, filename, purpose, chunks, expires_after_s, room)

    def get_file(self, owner: str, file_id: str) -> dict[str, Any]:
        return self.files.owned(owner, file_id).public()

    def file_content(self, owner: str, file_id: str) -> Iterator[bytes]:
        return self.files.content(owner, file_id)

    def file_redirect(self, owner: str, file_id: str) -> str | None:
        """Where to send a download too large for the front (`Limits.inline_download_bytes`); None: answer inline."""
        return self.files.redirect(owner, file_id)

    def delete_file(self, owner: str, file_id: str) -> dict[str, Any]:
        """A vision file that a batch still to run names is refused (409): its job reads it. Delete it once that
        batch has finished, or cancel the batch."""
        record = self.files.owned(owner, file_id)
        if record.purpose == vision.VISION:
            waiting = sorted(b.id for b in self.batches.open() if file_id in (b.image_files or {}))
            if waiting:
                message = f"file {file_id} is named by batch {waiting[0]}, which has not finished; it reads the file"
                raise ApiError(409, message, "file_id")
        return self.files.delete(owner, file_id)

    def list_files(self, owner: str, after: str | None, limit: int, order: str, purpose: str | None) -> dict[str, Any]:
        return self.files.list(owner, after, limit, order, purpose)

    # ---- uploads -----------------------------------------------------------------------------------------------

    def create_upload(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        declared = body.get("bytes")
        if isinstance(declared, int) and not isinstance(declared, bool):  # a wrong one is refused by the create
            self.holdings.check_upload(owner, declared)
        return self.uploads.create(owner, body)

    def add_upload_part(self, owner: str, upload_id: str, chunks: Iterable[bytes]) -> dict[str, Any]:
        return self.uploads.add_part(owner, upload_id, chunks, self.quotas.upload_parts)

    def complete_upload(self, owner: str, upload_id: str, part_ids: Any, md5: Any) -> dict[str, Any]:
        return self.uploads.complete(owner, upload_id, part_ids, md5)

    def cancel_upload(self, owner: str, upload_id: str) -> dict[str, Any]:
        return self.uploads.cancel(owner, upload_id)

    # ---- batches -----------------------------------------------------------------------------------------------

    def create_batch(
        self,
        owner: str,
        input_file_id: Any,
        endpoint: Any,
        completion_window: Any,
        metadata: Any = None,
        idempotency_key: Any = None,
    ) -> dict[str, Any]:
        """A new batch; with `idempotency_key` (the header), a retry answers the batch the first try made
        (idempotency.py)."""
        key = check_key(idempotency_key)
        if not isinstance(input_file_id, str) or not input_file_id:
            raise ApiError(400, "input_file_id is required", "input_file_id")
        if endpoint not in ENDPOINTS:
            raise ApiError(
                400, f"endpoint {endpoint!r} is not served here; use one of {', '.join(ENDPOINTS)}", "endpoint"
            )
        if completion_window not in COMPLETION_WINDOWS:
            raise ApiError(400, f"completion_window must be '24h', got {completion_window!r}", "completion_window")
        _check_metadata(metadata)
        asked_priority(metadata, self.quotas.key_priority(owner))  # a batch may only lower its key's priority
        source = self.files.owned(owner, input_file_id, "input_file_id")
        if source.purpose != "batch":
            raise ApiError(
                400, f"file {input_file_id} has purpose {source.purpose!r}; a batch needs 'batch'", "input_file_id"
            )
        batch_id, fresh = new_id("batch"), True
        if key is not None:
            params = {"input_file_id": input_file_id, "endpoint": endpoint, "window": completion_window}
            batch_id, fresh = self.claims.claim(owner, key, params_hash({**params, "metadata": metadata}))
            made = None if fresh else self.batches.get(batch_id)
            if made is not None:
                return made.public()
        created = self.now()
        record = BatchRecord(
            id=batch_id, endpoint=endpoint, model=self.model, input_file_id=input_file_id,
            completion_window=completion_window, created_at=created,
            expires_at=BatchRecord.window_end(created, completion_window), metadata=metadata, owner=owner,
            seq=self.records.seq(), input_key=source.key, output_key=f"batches/{batch_id}/output",
        )  # fmt: skip
        problems, record.request_counts.total, refs = self._validate_input(source.key, endpoint)
        if not problems and refs:
            record.image_files, problem = vision.resolve(refs, owner, lambda i: self.records.get(FileRecord, i))
            problems = [] if problem is None else [problem]
        if problems:  # a batch failed at validation holds nothing: no quota asked
            record.status, record.failed_at, record.done_at = "failed", created, created
            record.errors = batch_errors(problems)
        else:
            self.holdings.check_batch(owner, record.request_counts.total)
        try:
            self.batches.create(record)
        except StoreConflict:
            made = self.batches.get(batch_id) if key is not None else None
            if made is None:
                raise
            return made.public()  # a racing retry with the same key made it first
        return record.public()

    def _validate_input(self, key: str, endpoint: str) -> tuple[list[dict[str, Any]], int, list[tuple[int, str, str]]]:
        """What fails a batch before it runs (OpenAI's batch-level errors): no request, too many, or no line that
        could run at all (not JSONL, e.g. a CSV; or every line for another url than the batch's). A file with
        some runnable lines runs, and each bad line is the job's error line. Also, read in the same pass, every
        uploaded image a line names (line, file_id, param: vision.py), which the create checks are the owner's."""
        body = self.store.read_blob(key)
        if body is None:
            return [{"code": "file_not_found", "message": "the input file's content is gone"}], 0, []
        total, runnable = 0, False
        refs: list[tuple[int, str, str]] = []
        first_problem: dict[str, Any] | None = None

        def judge(line: bytes, number: int) -> None:
            nonlocal runnable, first_problem
            if runnable:
                return  # one runnable line is enough: the rest are only counted
            problem = _line_problem(line, endpoint)
            if problem is None:
                runnable = True
            elif first_problem is None:  # the first is the one reported
                first_problem = {**problem, "line": number}

        for total, line in enumerate(request_lines(body), start=1):  # total: read after the loop
            judge(line, total)
            check_request_bounds(total, line, self.quotas)
            refs.extend((total, file_id, param) for file_id, param in vision.line_refs(line))
        if total == 0:
            return [{"code": "empty_file", "message": "the input file holds no request"}], 0, []
        if total > self.limits.max_requests:
            message = f"the input file holds {total} requests; a batch takes at most {self.limits.max_requests}"
            return [{"code": "too_many_requests", "message": message}], total, []
        if not runnable and first_problem is not None:
            first_problem["message"] += "; no line of the file could run, so no job was started"
            return [first_problem], total, []
        return [], total, refs

    def get_batch(self, owner: str, batch_id: str) -> dict[str, Any]:
        return self.batches.owned(owner, batch_id).public()

    def list_batches(self, owner: str, after: str | None, limit: int) -> dict[str, Any]:
        return self.batches.page(owner, after, checked_limit(limit, 100))

    def cancel_batch(self, owner: str, batch_id: str) -> dict[str, Any]:
        found = self.batches.owned(owner, batch_id)
        if found.status == "cancelling":  # a retried cancel (its reply lost): the stop is under way
            return found.public()

        def cancel(record: BatchRecord) -> None:
            if record.closed or record.status == "cancelling":
                raise ApiError(409, f"batch {batch_id} is {record.status}; it cannot be cancelled", "batch_id")
            now = self.now()
            record.cancelling_at = now
            if record.status == "validating":  # queued: nothing runs, nothing to stop
                record.status, record.cancelled_at, record.done_at = "cancelled", now, now
            else:
                record.status, record.stop = "cancelling", "cancelled"

        record = self.batches.update(batch_id, cancel)
        if record.status == "cancelling":
            self.stop_run(batch_id)
        return record.public()

    def take_closed(self) -> Counter[str]:
        """The batches closed since the last call, by status; the count starts again from zero."""
        return self.batches.take_closed()

    def at_risk(self) -> int:
        """How many open batches the last tick found at risk of missing their window (at_risk.py)."""
        return len(self.scheduler.at_risk)

    def statuses(self) -> list[str]:
        """Every open batch's status as the last tick left them (read again only before any tick): the queue's
        gauges after a tick (queue_metrics.py), which count only open ones, at no read of their own (issue 61)."""
        return [record.status for record in self.batches.open_as_left()]

    # ---- the scheduler -----------------------------------------------------------------------------------------

    def tick(self) -> None:
        self.scheduler.tick()
        self.deliver_events()

    def deliver_events(self) -> None:
        """Send the events the outbox holds (event_delivery.py), after the tick's work: a send that fails, or a
        store error while recording how one went, waits for the next tick and never stops this one."""
        if self.events is None:
            return
        try:
            self.events.deliver()
        except Exception as error:
            print(f"llm-batch batch-api: sending events failed: {type(error).__name__}: {error}", file=sys.stderr)

    def stop_cancelled(self, batch_id: str) -> str:
        """Stop a cancelling batch's run now (the tick's `stop_batch`, sent by the front's cancel)."""
        found = self.batches.get(batch_id)
        if found is None or found.status != "cancelling":
            return "nothing to stop"  # a retried or late event: the batch closed or was never cancelled
        self.scheduler.stop(batch_id)
        return "stopping"

    def start_now(self, batch_id: str) -> str:
        return self.scheduler.start_now(batch_id)

    def next_run(
        self, execution_arn: str, polls: int, max_polls: int, poll_budget: int, asked: str | None = None
    ) -> dict[str, Any]:
        return self.scheduler.next_run(execution_arn, polls, max_polls, poll_budget, asked)

    def enqueue_night(self, scheduled_time: str) -> str:
        """Queue the schedule's night; the id of its entry."""
        return self.scheduler.enqueue_night(scheduled_time).id


def _line_problem(line: bytes, endpoint: str) -> dict[str, Any] | None:
    """Why one input line cannot run as a request of `endpoint` (OpenAI's BatchError fields), or None."""
    try:
        value = json.loads(line)
    except ValueError as error:  # also UnicodeDecodeError
        return {"code": "invalid_json_line", "message": f"the line is not JSON ({error}): a batch input is JSONL"}
    if not isinstance(value, dict):
        return {"code": "invalid_json_line", "message": "the line is not a JSON object: a batch input is JSONL"}
    url = value.get("url")
    if url != endpoint:
        message = f"the line's url {url!r} is not the batch's endpoint {endpoint!r}"
        return {"code": "invalid_url", "message": message, "param": "url"}
    return None


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


__all__ = ["ENDPOINTS", "BatchService"]
