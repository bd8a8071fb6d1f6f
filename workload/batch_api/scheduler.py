"""How a batch moves on (service.py's diagram): one `tick` expires, follows the running batch, starts the next,
and deletes what is past its retention; `next_run` hands the next queued entry (a batch, or a night of
nights.py) to the tiers' execution that holds the GPUs, so a night's queue runs on one boot. Everything it
knows of a run comes from the executor's `state` and the job's output folder in the store, so it resumes
correctly after any restart of the server.

What it reads of the job's output (workload/job/output.py's layout): `_commits/*.json` (the shard markers, for
request counts while the job runs), `summary.json` (written last: totals and tokens), and the OpenAI files the job
writes on completion and on a stop (`output.jsonl`, `errors.jsonl`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import TYPE_CHECKING, Any

from workload.batch_api import nights, objects, uploads
from workload.batch_api.executor import BatchRun
from workload.batch_api.objects import ACTIVE, TERMINAL, ApiError, batch_errors, file_record, not_found
from workload.batch_api.sfn_executor import StepFunctionsExecutor, run_input
from workload.batch_api.store import StoreConflict

if TYPE_CHECKING:
    from workload.batch_api.service import BatchService

OUTPUTS = (("output.jsonl", "output_file_id", "output"), ("errors.jsonl", "error_file_id", "error"))


def tick(service: BatchService) -> None:
    now = service.now()
    running = False
    for record in sorted(service.store.records("batch"), key=lambda r: (r["created_at"], r["_seq"])):
        if record["status"] == "validating" and now >= record["expires_at"]:
            _expire_queued(service, record["id"])
        elif record["status"] in ACTIVE:
            running = _follow(service, record, now) or running
    # An execution that holds the GPUs (a night's, or one on a batch that just ended) takes the next entry
    # itself when its run ends (`next_run`): starting one beside it would be a second boot.
    if not running and not service.executor.occupied():
        _start_next(service)
    _sweep(service, now)


def _expire_queued(service: BatchService, batch_id: str) -> None:
    def expire(record: dict[str, Any]) -> None:
        if record["status"] == "validating":
            record.update(status="expired", expired_at=service.now(), _done_at=service.now())

    service._update(batch_id, expire)


def _batch_run(service: BatchService, record: dict[str, Any]) -> BatchRun:
    store = service.store
    return BatchRun(record["id"], store.uri(record["_input_key"]), store.uri(record["_output_key"]), record["endpoint"])


def _start(service: BatchService, record: dict[str, Any]) -> None:
    service.executor.start(_batch_run(service, record))


def _queue(service: BatchService) -> list[tuple[str, dict[str, Any]]]:
    """What waits for the GPUs, oldest first: queued batches and the schedule's queued nights (nights.py)."""
    entries = [("batch", r) for r in service.store.records("batch") if r["status"] == "validating"]
    entries += [("night", r) for r in nights.queued(service)]
    return sorted(entries, key=lambda entry: (entry[1]["created_at"], entry[1]["_seq"]))


def _claim(service: BatchService, record: dict[str, Any]) -> dict[str, Any] | None:
    """Take a queued batch for a run (validating -> in_progress, by compare-and-swap); None: it is gone (its
    file deleted: failed), expired, or taken or cancelled since it was listed."""
    if service.now() >= record["expires_at"]:
        _expire_queued(service, record["id"])
        return None
    if service.store.blob_size(record["_input_key"]) is None:  # its file was deleted while it waited
        _finish(service, record["id"], "failed", "input_file_deleted: the batch's input file was deleted")
        return None

    def begin(current: dict[str, Any]) -> None:
        if current["status"] != "validating":
            raise StoreConflict("changed")
        current.update(status="in_progress", in_progress_at=service.now())

    try:
        return service._update(record["id"], begin)
    except StoreConflict:  # cancelled (or taken) since it was listed
        return None


def _start_next(service: BatchService) -> None:
    for kind, record in _queue(service):
        if kind == "night":
            if nights.claim(service, record["id"], None):
                arn = _executor(service).start_night(record["id"], record["date"])
                if arn is None:
                    nights.unclaim(service, record["id"])
                else:
                    nights.started_by(service, record["id"], arn)
            return
        claimed = _claim(service, record)
        if claimed is not None:
            _start(service, claimed)
            return


def _executor(service: BatchService) -> StepFunctionsExecutor:
    """Nights are queued only on the tiers (their schedule's), whose executor is the state machine's."""
    if not isinstance(service.executor, StepFunctionsExecutor):
        raise TypeError("a queued night needs the tiers' StepFunctionsExecutor")
    return service.executor


def next_run(
    service: BatchService, execution_arn: str, polls: int, max_polls: int, poll_budget: int, asked: str | None = None
) -> dict[str, Any]:
    """The running execution's NextBatch step: its run ended well (or was skipped) and it still holds the GPUs.

    Claims the oldest queued entry for it and answers `{"run": <the execution input of that run>}` (a batch's
    `{"batch": ...}`, a night's `{"date": ...}`), so the same boot runs it; or `{"none": why}`, and the execution
    releases the GPUs. `polls`: what the run that ended spent; the execution takes another run only while its
    polls so far plus a whole run's (`max_polls`) stay within `poll_budget`, which keeps it inside Step Functions'
    history limit (the machine's own timeout is set from the same budget, infra/components/nightly.py).
    `asked`: when the execution entered its NextBatch step; a retry of that step (the answer lost on its way)
    gets the answer already given, so no entry is claimed twice and none is left claimed by a run that never
    comes."""
    executor = _executor(service)
    again = executor.answered(execution_arn, asked)
    if again is not None:
        return again
    answer = _next_run(service, executor, execution_arn, polls, max_polls, poll_budget)
    executor.remember(execution_arn, asked, answer)
    return answer


def _next_run(
    service: BatchService,
    executor: StepFunctionsExecutor,
    execution_arn: str,
    polls: int,
    max_polls: int,
    poll_budget: int,
) -> dict[str, Any]:
    spent = executor.spend(execution_arn, polls)
    if spent + max_polls > poll_budget:
        return {"none": f"this execution has spent {spent} of its {poll_budget} polls; the next tick starts another"}
    for kind, record in _queue(service):
        if kind == "night":
            if nights.claim(service, record["id"], execution_arn):
                executor.turn(execution_arn, record["id"])
                return {"run": {"date": record["date"]}}
            continue
        claimed = _claim(service, record)
        if claimed is not None:
            run = _batch_run(service, claimed)
            executor.adopt(run, execution_arn)
            return {"run": run_input(run)}
    return {"none": "no batch is queued"}


def start_now(service: BatchService, batch_id: str) -> str:
    """Start one queued batch at once, ahead of its turn (`python -m infra.run STACK --batch ID`, through the
    front's function): the tick's own start, so the same executor path. Returns how the run stands (`running`, or
    `busy` when a run took the GPUs in between, which the next tick retries); refuses, in one line, a batch that
    is not queued, or a start while another run holds the GPUs (one job on them at a time; the execution that
    holds them runs the queue next, oldest first)."""
    records = list(service.store.records("batch"))
    if all(r["id"] != batch_id for r in records):
        raise not_found("Batch", batch_id)
    others = [r["id"] for r in records if r["status"] in ACTIVE and r["id"] != batch_id]
    if others:
        raise ApiError(409, f"batch {others[0]} is running; {batch_id} starts after it (one job on the GPUs)")
    mine = next(r for r in records if r["id"] == batch_id)
    if mine["status"] == "validating" and service.executor.occupied():
        # The execution on the GPUs takes the queue, oldest first, when its run ends: the same boot.
        raise ApiError(409, f"a run holds the GPUs; {batch_id} stays queued and runs after it on the same boot")

    def begin(record: dict[str, Any]) -> None:
        if record["status"] != "validating":
            raise ApiError(409, f"batch {batch_id} is {record['status']}, not queued: only a queued batch starts")
        record.update(status="in_progress", in_progress_at=service.now())

    _start(service, service._update(batch_id, begin))
    state = service.executor.state(batch_id)
    return state.name if state.reason is None else f"{state.name}: {state.reason}"


def _follow(service: BatchService, record: dict[str, Any], now: int) -> bool:
    """Look at the running batch and move it on; whether a job still runs (or should) for it."""
    batch_id, stop = record["id"], record.get("_stop")
    if stop is None and now >= record["expires_at"]:
        service._update(batch_id, lambda r: r.update(_stop=r.get("_stop") or "expired"))
        stop = "expired"
    if stop is not None:
        service.executor.stop(batch_id)  # again on every tick: idempotent, and it survives a server restart
    state = service.executor.state(batch_id)
    if state.name == "running":
        _count(service, record)
        return True
    if state.name == "succeeded":
        _finish(service, batch_id, stop or "completed")
        return False
    finished = service.store.blob_size(f"{record['_output_key']}/summary.json") is not None
    if state.name == "failed" and not finished:
        _finish(service, batch_id, "failed", f"job_failed: {state.reason}")
        return False
    if finished and state.name != "busy":  # the summary is written last: every request has its answer
        _finish(service, batch_id, stop or "completed")
        return False
    # stopped, refused (another attempt holds the output) or unknown to this executor (the server restarted)
    if stop is not None and state.name != "busy":
        _finish(service, batch_id, stop)
        return False
    _start(service, record)  # resume: the job redoes only what was not committed
    return True


def _count(service: BatchService, record: dict[str, Any]) -> None:
    """request_counts from the shards committed so far (one marker per shard counts: the latest attempt's)."""
    store, prefix = service.store, f"{record['_output_key']}/_commits"
    best: dict[int, dict[str, Any]] = {}
    for key in store.list_blobs(prefix):
        body = store.read_blob(key)
        if body is None or not key.endswith(".json"):
            continue
        marker = json.loads(b"".join(body))
        shard = int(marker["shard"])
        if shard not in best or marker.get("attempt", 0) >= best[shard].get("attempt", 0):
            best[shard] = marker
    completed = sum(int(m["rows_ok"]) for m in best.values())
    failed = sum(int(m["rows_failed"]) for m in best.values())
    counts = record["request_counts"]
    if (counts["completed"], counts["failed"]) == (completed, failed):
        return

    def progress(current: dict[str, Any]) -> None:
        current["request_counts"].update(completed=completed, failed=failed)
        done = completed + failed >= current["request_counts"]["total"]
        if done and current["status"] == "in_progress":  # every request answered: the job writes its files
            current.update(status="finalizing", finalizing_at=service.now())

    service._update(record["id"], progress)


def _lines(service: BatchService, key: str) -> int:
    body = service.store.read_blob(key)
    return 0 if body is None else sum(chunk.count(b"\n") for chunk in body)


def _output_file_id(batch_id: str, kind: str) -> str:
    # Derived from the batch: finishing twice (a restart between the two writes) makes the same file, not two.
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


def _finish(service: BatchService, batch_id: str, status: str, reason: str | None = None) -> None:
    """Close the batch as `status`, with the files the job wrote (whole or, after a stop, partial)."""
    found = service.store.get("batch", batch_id)
    if found is None or found.record["status"] in TERMINAL:
        return
    record, store, now = found.record, service.store, service.now()
    output = record["_output_key"]
    ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
    counts: dict[str, int] = {}
    for name, field, kind in OUTPUTS:
        key = f"{output}/{name}"
        size = store.blob_size(key)
        counts[kind] = _lines(service, key) if size else 0
        if not size:  # OpenAI leaves the id null when there is nothing in the file
            continue
        file_id = _output_file_id(batch_id, kind)
        ids[field] = file_id
        entry = file_record(
            file_id,
            f"{batch_id}_{kind}.jsonl",
            "batch_output",
            size,
            now,
            now + service.limits.retention_s,
            owner=record["_owner"],
            seq=service._seq(),
            key=key,
        )
        with contextlib.suppress(StoreConflict):  # made by an earlier finish that did not get to write the batch
            store.put("file", entry, None)
    summary_body = store.read_blob(f"{output}/summary.json")
    summary = json.loads(b"".join(summary_body)) if summary_body is not None else None

    def close(current: dict[str, Any]) -> None:
        if current["status"] in TERMINAL:
            return
        stamp = {"completed": "completed_at", "failed": "failed_at", "expired": "expired_at"}
        current.update(ids, status=status, _done_at=now)
        current[stamp.get(status, "cancelled_at")] = now
        if status == "completed" and current["finalizing_at"] is None:
            current["finalizing_at"] = now
        total = int(summary["rows_in"]) if summary else current["request_counts"]["total"]
        if ids["output_file_id"] or ids["error_file_id"] or summary:
            current["request_counts"] = {"total": total, "completed": counts["output"], "failed": counts["error"]}
        current[objects.SIDE_FIELD] = objects.gpu_share(summary)  # the job's GPU time and cost: docs/batch-api.md
        if summary:
            current["usage"] = {
                "input_tokens": int(summary["input_tokens"]),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": int(summary["output_tokens"]),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": int(summary["input_tokens"]) + int(summary["output_tokens"]),
            }
        if reason is not None:
            code, _, message = reason.partition(": ")
            current["errors"] = batch_errors([{"code": code, "message": message}])

    service._update(batch_id, close)


def _sweep(service: BatchService, now: int) -> None:
    """Retention: a file past its `expires_at` is deleted (record and body), and a finished batch's job output
    folder once the retention has passed since it finished (its output files expire at the same moment)."""
    store = service.store
    uploads.sweep_uploads(service, now)
    nights.sweep(service, now)
    for record in store.records("file"):
        if record["expires_at"] is not None and now >= record["expires_at"]:
            store.delete("file", record["id"])
            store.delete_blobs(record["_key"])
    for record in store.records("batch"):
        done = record.get("_done_at")
        if done is not None and not record.get("_output_deleted") and now >= done + service.limits.retention_s:
            store.delete_blobs(record["_output_key"])
            service._update(record["id"], lambda r: r.update(_output_deleted=True))
