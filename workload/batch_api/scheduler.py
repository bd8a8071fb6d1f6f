"""How a batch moves on (service.py's diagram), and the only caller of the executor.

One `tick` expires, follows the running batch, starts the next, and deletes what is past its retention;
`next_run` hands the next queued entry (a batch, or a night of nights.py) to the tiers' execution that holds the
GPUs, so a night's queue runs on one boot; `stop` carries out a cancel at once (the tick repeats it until the run
has stopped). Everything it knows of a run comes from the executor's `state` and the job's output folder in the
store, so it resumes correctly after any restart of the server.

What it reads of the job's output (workload/job/output.py's layout): `_commits/*.json` (the shard markers, for
request counts while the job runs), `summary.json` (written last: totals and tokens), and the OpenAI files the job
writes on completion and on a stop (`output.jsonl`, `errors.jsonl`).

Nights and a run handed over inside an execution exist only where the executor has an execution chain (the
tiers' state machine: `Executor.chain()`); locally every run is one the scheduler started, and a queued night
is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from datetime import datetime
from typing import Any

from workload.batch_api import at_risk, objects, pools
from workload.batch_api.batch_index import DONE_KIND, ORDER_KIND, order_id
from workload.batch_api.batches import BatchBook
from workload.batch_api.executor import BatchRun, ExecutionChain, Executor, RunState
from workload.batch_api.files import Files
from workload.batch_api.idempotency import Claims
from workload.batch_api.models import BatchRecord, NightEntry, Record
from workload.batch_api.nights import Nights, entry_id
from workload.batch_api.objects import ACTIVE, ApiError, batch_errors, not_found
from workload.batch_api.pools import PoolSettings, run_of
from workload.batch_api.priorities import queue_order
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict
from workload.batch_api.unfinished import UNFINISHED, unfinished_lines
from workload.batch_api.uploads import Uploads
from workload.contract.batch_api_quotas import BatchApiQuotas
from workload.contract.jsonl_lines import request_lines

OUTPUT, ERRORS = "output.jsonl", "errors.jsonl"  # the job's files (workload/job/openai_files.py)
STOPPED_ERRORS = "batch_errors.jsonl"  # a stopped batch's error file: the job's, then what never ran (unfinished.py)
# Finished batches deleted a tick at most: each costs about five requests, so 100 stay well inside the tick's
# 120 s timeout, and at one tick a minute (the tiers) 144,000 a day clear any backlog an upgrade finds.
RETENTION_PER_TICK = 100
STAMPS = {"completed": "completed_at", "failed": "failed_at", "expired": "expired_at", "cancelled": "cancelled_at"}


def _output_file_id(batch_id: str, kind: str) -> str:
    # Derived from the batch: finishing twice (a restart between the two writes) makes the same file, not two.
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


class Scheduler:
    def __init__(
        self,
        records: Records,
        batches: BatchBook,
        executor: Executor,
        files: Files,
        uploads: Uploads,
        quotas: BatchApiQuotas | None = None,
        pool_settings: PoolSettings | None = None,
    ) -> None:
        self.records, self.store, self.batches, self.executor = records, records.store, batches, executor
        self.files, self.uploads = files, uploads
        self.quotas = quotas or BatchApiQuotas()  # the priorities per key the queue is ordered by (priorities.py)
        self.pools = pool_settings or PoolSettings()  # how many batches share a run, and when one joins (pools.py)
        self.at_risk: dict[str, dict[str, Any]] = {}  # the last tick's reports, by batch id (at_risk.py)
        self.retention_s = files.limits.retention_s
        self.nights = Nights(records, self.retention_s)
        self.claims = Claims(records)

    # ---- the tick ----------------------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.records.now()
        running = False
        open_ = self.batches.open()  # the open-batches index and each open batch: never every batch (issue 61)
        runs: dict[str, list[BatchRecord]] = {}
        for record in open_:
            if record.status == "validating" and now >= record.expires_at:
                self._expire_queued(record.id)
            elif record.status in ACTIVE:
                runs.setdefault(run_of(record), []).append(record)
        again: list[BatchRecord] = []  # batches whose run ended short: they run again, first
        for run_id, members in runs.items():
            still, left = self._follow(run_id, members, now, open_)
            running, again = running or still, again + left
        # An execution that holds the GPUs (a night's, or one on a batch that just ended) takes the next entry
        # itself when its run ends (`next_run`): starting one beside it would be a second boot.
        self._recover_nights(now)
        if again:  # resume: the job redoes only what was not committed; queued batches may join
            self._start_group(again, open_)
        elif not running and not self.executor.occupied():
            self._start_next(open_)
        self._report_at_risk(now)
        self._sweep(now, open_)

    def _report_at_risk(self, now: int) -> None:
        """Which open batches cannot finish in their window at the measured rate (at_risk.py), in the order they
        will run: the running one first (not one being stopped), then the queue."""
        open_ = self.batches.open_as_left()  # as this tick left them: no read
        if not open_:  # an idle tick reads nothing more (infra/pricing/batch_api_requests.py bills what it reads)
            self.at_risk = {}
            return
        running = [r for r in open_ if r.status in ("in_progress", "finalizing") and r.stop is None]
        # The nights are not listed again: their rows are not known here (at_risk.py).
        queued = queue_order([r for r in open_ if r.status == "validating"], self.quotas)
        in_order = [*running, *(r for r in queued if isinstance(r, BatchRecord))]
        self.at_risk = at_risk.assess(in_order, now, at_risk.rate(self.records))
        at_risk.report(self.batches, open_, self.at_risk, now)

    def _recover_nights(self, now: int) -> None:
        """A night claimed for a start that never named its execution: its execution, found by name, if the start
        applied (its reply lost), else queued again, so no night is stranded by a failed start."""
        chain = self.executor.chain()
        if chain is None:  # nights are the tiers' only
            return
        for entry in self.nights.stranded(now):
            arn = chain.execution_of(entry.id)
            if arn is None:
                self.nights.unclaim(entry.id)
            else:
                self.nights.started_by(entry.id, arn)

    def stop(self, batch_id: str) -> None:
        """Ask the batch's run to stop (a cancel): at once here, and again on every tick until it has. A run
        over several batches stops whole; the others run again at once without it (pools.py)."""
        record = self.batches.get(batch_id)
        self.executor.stop(run_of(record) if record is not None else batch_id)

    def _expire_queued(self, batch_id: str) -> None:
        def expire(record: BatchRecord) -> None:
            if record.status == "validating":
                record.status, record.expired_at, record.done_at = "expired", self.records.now(), self.records.now()

        self.batches.update(batch_id, expire)

    def _batch_run(self, record: BatchRecord) -> BatchRun:
        images = {file_id: self.store.uri(key) for file_id, key in (record.image_files or {}).items()}
        input_uri, output_uri = self.store.uri(record.input_key), self.store.uri(record.output_key)
        return BatchRun(record.id, input_uri, output_uri, record.endpoint, images)

    def _queue(self, open_: list[BatchRecord] | None = None) -> list[Record]:
        """What waits for the GPUs, first to run first: queued batches and the schedule's queued nights
        (nights.py), by priority, then the end of their window, then age (priorities.py). `open_`: the open
        batches as the tick read them (a claim checks each again by compare-and-swap)."""
        batches = self.batches.open() if open_ is None else open_
        waiting: list[Record] = [r for r in batches if r.status == "validating"]
        return queue_order([*waiting, *self.nights.queued()], self.quotas)

    def _claim(self, record: BatchRecord, pool_id: str | None = None) -> BatchRecord | None:
        """Take a queued batch for a run (validating -> in_progress, by compare-and-swap), alone or in the pool
        `pool_id`; None: it is gone (its file deleted: failed), expired, or taken or cancelled since it was
        listed."""
        if self.records.now() >= record.expires_at:
            self._expire_queued(record.id)
            return None
        if self.store.blob_size(record.input_key) is None:  # its file was deleted while it waited
            self._finish(record.id, "failed", "input_file_deleted: the batch's input file was deleted")
            return None

        def begin(current: BatchRecord) -> None:
            if current.status != "validating":
                raise StoreConflict("changed")
            current.status, current.in_progress_at = "in_progress", self.records.now()
            current.pool_id, current.run_since = pool_id, self.records.now()

        try:
            return self.batches.update(record.id, begin)
        except StoreConflict:  # cancelled (or taken) since it was listed
            return None

    def _start_next(self, open_: list[BatchRecord]) -> None:
        queue = self._queue(open_)
        for place, entry in enumerate(queue):
            if isinstance(entry, NightEntry):
                chain = self._chain()
                if self.nights.claim(entry.id, None):
                    arn = chain.start_night(entry.id, entry.date)
                    if arn is None:
                        self.nights.unclaim(entry.id)
                    else:
                        self.nights.started_by(entry.id, arn)
                return
            assert isinstance(entry, BatchRecord)
            run = self._group_run([], queue[place:])  # this batch first, then the ones that may share its run
            if run is not None:
                self.executor.start(run)
                return

    def _start_group(self, again: list[BatchRecord], open_: list[BatchRecord]) -> None:
        """Start the batches whose run ended short again, with what may join them (one endpoint a run: the
        first's; the others wait for the run after it)."""
        endpoint = again[0].endpoint
        run = self._group_run([r for r in again if r.endpoint == endpoint], self._queue(open_))
        if run is not None:
            self.executor.start(run)

    def _group_run(self, again: list[BatchRecord], queue: list[Record]) -> BatchRun | None:
        """Claim a run's batches: `again` (already running) and queued ones of the same endpoint, in the queue's
        order, up to the pool's size (pools.py); one batch runs alone, several as a pool. None: nothing to run
        (every candidate went since it was listed)."""
        candidates = pools.joiners(again, queue, self.pools)
        grouped = [*again, *candidates]
        spec = pools.needs_spec(grouped)
        pool_id = pools.new_pool_id([r.id for r in grouped], self.records.now()) if spec else None
        members = [self._rejoin(r, pool_id) for r in again]
        members += [claimed for r in candidates if (claimed := self._claim(r, pool_id)) is not None]
        if not members:
            return None
        if pool_id is not None and pools.needs_spec(members):
            return pools.pool_run(pool_id, members, self.store.uri, self._write_spec)
        # The others went since they were listed: this one runs alone.
        alone = members[0] if members[0].pool_id is None else self._rejoin(members[0], None)
        return self._batch_run(alone)

    def _rejoin(self, record: BatchRecord, pool_id: str | None) -> BatchRecord:
        """A running batch's next run: alone or in the pool `pool_id`."""

        def move(current: BatchRecord) -> None:
            current.pool_id, current.run_since = pool_id, self.records.now()

        return self.batches.update(record.id, move)

    def _write_spec(self, key: str, body: bytes) -> None:
        self.store.write_blob(key, iter([body]))

    def _chain(self) -> ExecutionChain:
        """Nights are queued, and runs handed over, only on the tiers, whose executor chains its runs."""
        chain = self.executor.chain()
        if chain is None:
            raise TypeError("a queued night or a handed-over run needs an executor that chains runs (the tiers')")
        return chain

    # ---- the execution's next run, a start ahead of the queue, a night queued ----------------------------------

    def next_run(
        self, execution_arn: str, polls: int, max_polls: int, poll_budget: int, asked: str | None = None
    ) -> dict[str, Any]:
        """The running execution's NextBatch step: its run ended well (or was skipped) and it still holds the GPUs.

        Claims the first queued entry (in the queue's order, priorities.py) for it and answers `{"run": <the
        execution input of that run>}` (a batch's `{"batch": ...}`, a night's `{"date": ...}`), so the same boot
        runs it; or `{"none": why}`, and the execution releases the GPUs. `polls`: what the run that ended spent;
        the execution takes another run only while its polls so far plus a whole run's (`max_polls`) stay within
        `poll_budget`, which keeps it inside Step Functions' history limit (the machine's own timeout is set from
        the same budget, infra/components/nightly.py). `asked`: when the execution entered its NextBatch step; a
        retry of that step (the answer lost on its way) gets the answer already given, so no entry is claimed
        twice and none is left claimed by a run that never comes."""
        chain = self._chain()
        again = chain.answered(execution_arn, asked)
        if again is not None:
            self._hand_over(chain, execution_arn, again)  # the first answer may have died before its hand-over
            return again
        answer = self._next_run(chain, execution_arn, polls, max_polls, poll_budget)
        # Remembered before the hand-over, so a retry after a failure anywhere from here on gets this run again
        # (and hands it over); a failure before it leaves the claimed batch with no execution, which the tick
        # starts again: queued or running, never failed unrun.
        chain.remember(execution_arn, asked, answer)
        self._hand_over(chain, execution_arn, answer)
        return answer

    def _hand_over(self, chain: ExecutionChain, execution_arn: str, answer: dict[str, Any]) -> None:
        """Make `answer`'s run the execution's (idempotent: a retry writes the same markers)."""
        run = answer.get("run") or {}
        if "batch" in run:
            given = run["batch"]
            batch_run = BatchRun(given["id"], given["input_uri"], given["output_uri"], given["endpoint"])
            chain.adopt(batch_run, execution_arn)
        elif "date" in run:
            chain.turn(execution_arn, entry_id(run["date"]))

    def _next_run(
        self, chain: ExecutionChain, execution_arn: str, polls: int, max_polls: int, poll_budget: int
    ) -> dict[str, Any]:
        spent = chain.spend(execution_arn, polls)
        if spent + max_polls > poll_budget:
            spent_note = f"this execution has spent {spent} of its {poll_budget} polls; the next tick starts another"
            return {"none": spent_note}
        queue = self._queue()
        for place, entry in enumerate(queue):
            if isinstance(entry, NightEntry):
                if self.nights.claim(entry.id, execution_arn):
                    return {"run": {"date": entry.date}}
                continue
            assert isinstance(entry, BatchRecord)
            run = self._group_run([], queue[place:])  # this batch first, then the ones that may share its run
            if run is not None:
                return {"run": chain.execution_input(run)}
        return {"none": "no batch is queued"}

    def start_now(self, batch_id: str) -> str:
        """Start one queued batch at once, ahead of its turn (`python -m infra.run STACK --batch ID`, through the
        front's function): the tick's own start, so the same executor path. Returns how the run stands
        (`running`, or `busy` when a run took the GPUs in between, which the next tick retries); refuses, in one
        line, a batch that is not queued, or a start while another run holds the GPUs (one job on them at a
        time; the execution that holds them runs the queue next, in its order)."""
        records = self.batches.open()
        mine = self.batches.get(batch_id)
        if mine is None:
            raise not_found("Batch", batch_id)
        others = [r.id for r in records if r.status in ACTIVE and r.id != batch_id]
        if others:
            raise ApiError(409, f"batch {others[0]} is running; {batch_id} starts after it (one job on the GPUs)")
        if mine.status == "validating" and self.executor.occupied():
            # The execution on the GPUs takes the queue, in its order, when its run ends: the same boot.
            raise ApiError(409, f"a run holds the GPUs; {batch_id} stays queued and runs after it on the same boot")

        def begin(record: BatchRecord) -> None:
            if record.status != "validating":
                raise ApiError(409, f"batch {batch_id} is {record.status}, not queued: only a queued batch starts")
            record.status, record.in_progress_at = "in_progress", self.records.now()

        self.executor.start(self._batch_run(self.batches.update(batch_id, begin)))
        state = self.executor.state(batch_id)
        return state.name if state.reason is None else f"{state.name}: {state.reason}"

    def enqueue_night(self, scheduled_time: str) -> NightEntry:
        return self.nights.enqueue(scheduled_time)

    # ---- following a run ---------------------------------------------------------------------------------------

    def _follow(
        self, run_id: str, members: list[BatchRecord], now: int, open_: list[BatchRecord]
    ) -> tuple[bool, list[BatchRecord]]:
        """Look at a run and move its batches on: whether it still runs (or should), and the batches it left
        unfinished, which run again. A run over several batches (pools.py) stops whole for a stop of one of them
        or for a queued batch to join it; a batch of it whose job finished closes while the others run on."""
        stopping = False
        for record in members:
            if record.stop is None and now >= record.expires_at and not self._finished_in_window(record):

                def expire(current: BatchRecord) -> None:
                    current.stop = current.stop or "expired"

                record.stop = self.batches.update(record.id, expire).stop
            stopping = stopping or record.stop is not None
        pooled = members[0].pool_id is not None
        if stopping or (self._joins_stop_runs() and pools.join_due(members, self._queue(open_), self.pools, now)):
            self.executor.stop(run_id)  # again on every tick: idempotent, and it survives a server restart
        state = self.executor.state(run_id)
        if state.name == "running":
            for record in members:
                if pooled and self._summary_written(record):  # its job finished it: the others run on
                    self._finish(record.id, record.stop or "completed")
                else:
                    self._count(record)
            return True, []
        left = [record for record in members if self._after_run(record, state, pooled)]
        if pooled:
            pools.forget(run_id, self.store.delete_blobs)
        return False, left

    def _joins_stop_runs(self) -> bool:
        """A queued batch joins by a stop of the run only where a stop restarts just the job; on the tiers it
        releases the GPUs, so a newcomer joins when the execution's run ends (pools.py)."""
        return self.executor.chain() is None

    def _summary_written(self, record: BatchRecord) -> bool:
        return self.store.blob_size(f"{record.output_key}/summary.json") is not None

    def _after_run(self, record: BatchRecord, state: RunState, pooled: bool) -> bool:
        """Close a batch whose run has ended, as that run and its own output say; whether it must run again."""
        batch_id, stop = record.id, record.stop
        finished = self._summary_written(record)
        if state.name == "succeeded" and (finished or not pooled):
            self._finish(batch_id, stop or "completed")
            return False
        refused = self._refusal(record) if pooled and not finished else None
        if refused is not None and state.name != "busy":  # the pool went on without it
            self._finish(batch_id, "failed", f"job_failed: {refused}")
            return False
        if state.name == "failed" and not finished:
            self._finish(batch_id, "failed", f"job_failed: {state.reason}")
            return False
        if finished and state.name != "busy":  # the summary is written last: every request has its answer
            self._finish(batch_id, stop or "completed")
            return False
        # stopped, refused (another attempt holds the output) or unknown to this executor (the server restarted)
        if stop is not None and state.name != "busy":
            self._finish(batch_id, stop)
            return False
        if state.name == "absent" and self.store.blob_size(record.input_key) is None:
            self._finish(batch_id, "failed", "input_file_deleted: the batch's input file was deleted")
            return False
        return True

    def _refusal(self, record: BatchRecord) -> str | None:
        """Why the job refused this batch of a pool (its `_failed.json`, workload/job/output.py), if it did."""
        body = self.store.read_blob(f"{record.output_key}/_failed.json")
        if body is None:
            return None
        return str(json.loads(b"".join(body)).get("reason") or "the job refused it")

    def _finished_in_window(self, record: BatchRecord) -> bool:
        """Whether the batch's job finished (its summary written) before `expires_at`: a tick after the window
        does not make a batch that finished inside it `expired`."""
        body = self.store.read_blob(f"{record.output_key}/summary.json")
        if body is None:
            return False
        finished = json.loads(b"".join(body)).get("finished_at")
        if not isinstance(finished, str):
            return False
        return datetime.fromisoformat(finished.replace("Z", "+00:00")).timestamp() < record.expires_at

    def _count(self, record: BatchRecord) -> None:
        """request_counts from the shards committed so far (one marker per shard counts: the latest attempt's)."""
        best: dict[int, dict[str, Any]] = {}
        for key in self.store.list_blobs(f"{record.output_key}/_commits"):
            body = self.store.read_blob(key)
            if body is None or not key.endswith(".json"):
                continue
            marker = json.loads(b"".join(body))
            shard = int(marker["shard"])
            if shard not in best or marker.get("attempt", 0) >= best[shard].get("attempt", 0):
                best[shard] = marker
        completed = sum(int(m["rows_ok"]) for m in best.values())
        failed = sum(int(m["rows_failed"]) for m in best.values())
        if (record.request_counts.completed, record.request_counts.failed) == (completed, failed):
            return

        def progress(current: BatchRecord) -> None:
            counts = current.request_counts
            counts.completed, counts.failed = completed, failed
            done = completed + failed >= counts.total
            if done and current.status == "in_progress":  # every request answered: the job writes its files
                current.status, current.finalizing_at = "finalizing", self.records.now()

        self.batches.update(record.id, progress)

    def _lines(self, key: str) -> int:
        body = self.store.read_blob(key)
        return 0 if body is None else sum(chunk.count(b"\n") for chunk in body)

    def _stopped_errors(self, record: BatchRecord, status: str) -> str:
        """Write a stopped batch's error file (the job's error lines, then one `batch_expired` or
        `batch_cancelled` line per request the run never answered) and name it; the job's own errors.jsonl where
        the input is gone, so nothing can be said of what did not run."""
        requests = self.store.read_blob(record.input_key)
        if requests is None:
            return ERRORS
        answered = [self.store.read_blob(f"{record.output_key}/{name}") or iter(()) for name in (OUTPUT, ERRORS)]
        job_errors = self.store.read_blob(f"{record.output_key}/{ERRORS}") or iter(())
        answers = itertools.chain.from_iterable(request_lines(body) for body in answered)
        lines = unfinished_lines(record.id, status, request_lines(requests), answers)
        self.store.write_blob(f"{record.output_key}/{STOPPED_ERRORS}", itertools.chain(job_errors, lines))
        return STOPPED_ERRORS

    def _finish(self, batch_id: str, status: str, reason: str | None = None) -> None:
        """Close the batch as `status`, with the files the job wrote (whole or, after a stop, partial)."""
        record = self.batches.get(batch_id)
        if record is None or record.closed:
            return
        now = self.records.now()
        ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        summary_body = self.store.read_blob(f"{record.output_key}/summary.json")
        summary = json.loads(b"".join(summary_body)) if summary_body is not None else None
        # A finished job's summary holds its files' line counts; only a stopped one's partial files are counted.
        written = (summary or {}).get("openai_files")
        counts: dict[str, int] = {}
        errors = self._stopped_errors(record, status) if status in UNFINISHED else ERRORS
        for name, field, kind in ((OUTPUT, "output_file_id", "output"), (errors, "error_file_id", "error")):
            key = f"{record.output_key}/{name}"
            size = self.store.blob_size(key)
            if not size:
                counts[kind] = 0
            elif written is not None and name in (OUTPUT, ERRORS):  # a stop's error file adds unanswered lines
                counts[kind] = int(written[f"{kind}_lines"])
            else:
                counts[kind] = self._lines(key)
            if not size:  # OpenAI leaves the id null when there is nothing in the file
                continue
            file_id = _output_file_id(batch_id, kind)
            ids[field] = file_id
            with contextlib.suppress(StoreConflict):  # made by an earlier finish that did not get to write the batch
                self.files.record(record.owner, file_id, f"{batch_id}_{kind}.jsonl", "batch_output", size, key)

        def close(current: BatchRecord) -> None:
            if current.closed:
                return
            current.output_file_id, current.error_file_id = ids["output_file_id"], ids["error_file_id"]
            current.status, current.done_at = status, now
            setattr(current, STAMPS.get(status, "cancelled_at"), now)
            if status == "completed" and current.finalizing_at is None:
                current.finalizing_at = now
            total = int(summary["rows_in"]) if summary else current.request_counts.total
            if ids["output_file_id"] or ids["error_file_id"] or summary:
                current.request_counts.total, current.request_counts.completed = total, counts["output"]
                current.request_counts.failed = counts["error"]
            current.llm_batch = objects.gpu_share(summary)  # the job's GPU time and cost: docs/batch-api.md
            if summary:
                current.usage = {
                    "input_tokens": int(summary["input_tokens"]),
                    # vLLM's prefix-cache hits, summed by the job (a summary from before it counted them has none)
                    "input_tokens_details": {"cached_tokens": int(summary.get("cached_tokens", 0))},
                    "output_tokens": int(summary["output_tokens"]),
                    # the thinking a reasoning parser read apart, summed by the job (none in an older summary)
                    "output_tokens_details": {"reasoning_tokens": int(summary.get("reasoning_tokens", 0))},
                    "total_tokens": int(summary["input_tokens"]) + int(summary["output_tokens"]),
                }
            if reason is not None:
                code, _, message = reason.partition(": ")
                current.errors = batch_errors([{"code": code, "message": message}])

        written = self.batches.update(batch_id, close)
        if written.status == "completed":  # the measure keeps one sample per batch: a second finish adds none
            at_risk.record_run(self.records, batch_id, summary)

    # ---- retention ---------------------------------------------------------------------------------------------

    def _sweep(self, now: int, open_: list[BatchRecord]) -> None:
        """Retention: a file past its `expires_at` is deleted (record and body), and a finished batch once the
        retention has passed since it finished: its job output, its record and its markers, at most
        RETENTION_PER_TICK a tick, oldest finish first (one listing of the retention's queue, batch_index.py)."""
        self.uploads.sweep(now)
        self.nights.sweep(now)
        # A queued batch's input, and the vision files its lines name, outlive their expiry until the batch has
        # run: the job reads them.
        users = {r.input_file_id for r in open_} | {i for r in open_ for i in (r.image_files or {})}
        self.files.sweep(now, frozenset(users))
        self.claims.sweep(now)
        for marker, batch_id in self.batches.index.done_by(now - self.retention_s, RETENTION_PER_TICK):
            record = self.batches.get(batch_id)
            if record is not None:
                # The listing's marker first: a delete that dies after it leaves the record and this marker,
                # and the next tick finishes it; never a marker naming nothing.
                self.store.delete(ORDER_KIND, order_id(record))
                self.store.delete_blobs(record.output_key)
                self.records.delete(BatchRecord, batch_id)
            self.store.delete(DONE_KIND, marker)
