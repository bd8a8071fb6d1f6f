"""One run of the batch job: lease, plan the input, resume, stream rows through the pipeline, commit shard by
shard, summarise.

The cluster reads and validates the input (workload/job/input_stream.py); the driver holds the plan (per file), the
shards in flight and the commits (per shard), never the rows. A cheap count of each file's records numbers every
row by its place in the input, and rows are grouped into fixed shards of `output.shard_rows`, so every attempt
agrees on which row belongs to which shard and a rerun reads and sends the engine only the rows of shards not yet
committed. Before anything else the attempt takes the output's lease (workload/job/lease.py), so two attempts never
write one output at once; an attempt that loses it stops before its next write.
"""

from __future__ import annotations

import hashlib
import json
import queue
import resource
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from workload import failpoints
from workload.contract.config import ConfigError, JobConfig, seeded_cpu_conflict
from workload.files.results import (
    ENGINE_FIRST_REQUEST_COLUMN,
    ENGINE_RESTARTS_COLUMN,
    EngineCrashLoopError,
    ShardBuffer,
    classify_inference_error,
    finish_reason,
)
from workload.job.input_plan import REJECTED_PREFIX, InputPlan, passthrough_of, plan_input, row_error
from workload.job.lease import LeaseLostError, OutputLease, hold_lease
from workload.job.output import OutputStore, ShardCommit, utc_now
from workload.job.summary import build_summary, print_summary
from workload.telemetry.metric_sinks import open_metrics
from workload.telemetry.metrics import BatchReport, RunMetrics
from workload.telemetry.progress import Progress

NOTE_INTERVAL_S = 30.0  # how stale a killed attempt's recorded wall time may be, at most (one manifest write)


class OutputMismatchError(RuntimeError):
    """The output holds rows made with settings that would change results; mixing them is refused."""


@dataclass
class RunOutcome:
    summary: dict[str, Any] | None  # None when the run was stopped before every shard was committed
    interrupted: bool
    exit_code: int


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else key))
        return flat
    return {prefix: value}


def _identity(entry: dict[str, Any]) -> dict[str, Any]:
    """What says a file is unchanged: its size and content version (its record count follows from them)."""
    return {"size": entry["size"], "version": entry["version"]}


def _fingerprint(listing: dict[str, dict[str, Any]]) -> str:
    identities = {uri: _identity(entry) for uri, entry in listing.items()}
    return hashlib.sha256(json.dumps(identities, sort_keys=True).encode()).hexdigest()[:16]


def _legacy_fingerprint(listing: dict[str, dict[str, Any]]) -> str:
    """The fingerprint of outputs made before content versions were recorded: names and sizes only."""
    pairs = [(uri, entry["size"]) for uri, entry in sorted(listing.items())]
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]


def _changed_inputs(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    changes = []
    for uri in sorted(old.keys() | new.keys()):
        if uri not in new:
            changes.append(f"{uri} (removed)")
        elif uri not in old:
            changes.append(f"{uri} (added)")
        elif _identity(old[uri]) != _identity(new[uri]):
            what = "size" if old[uri]["size"] != new[uri]["size"] else "content"
            changes.append(f"{uri} ({what} changed)")
    return changes


def _check_same_input(store: OutputStore, config: JobConfig, manifest: dict[str, Any], listing: dict) -> None:
    recorded = manifest.get("input_files")
    if recorded is None:  # an output begun before versions were recorded: names and sizes are all it can compare
        if manifest["input_fingerprint"] != _legacy_fingerprint(listing):
            raise OutputMismatchError(
                f"{store.root.uri} holds output of a different input (files or sizes changed under "
                f"{config.input.uri}). Use a new output URI, or --restart to start over."
            )
        manifest.update(input_files=listing, input_fingerprint=_fingerprint(listing))
        return
    changed = _changed_inputs(recorded, listing)
    if changed:
        raise OutputMismatchError(
            f"{store.root.uri} holds output of a different input; changed since it was made: {', '.join(changed)}. "
            "Use a new output URI, or --restart to start over."
        )


def _start_attempt(
    store: OutputStore, config: JobConfig, plan: InputPlan, manifest: dict[str, Any] | None
) -> tuple[dict[str, Any], int]:
    """Check the output against this config (refusing to mix), then record a new attempt."""
    listing = plan.listing()
    identity = {
        "config_hash": config.output_hash(),
        "output_affecting": config.output_affecting(),
        "input_fingerprint": _fingerprint(listing),
        "input_files": listing,
        "rows_in": plan.rows_in,
    }
    if manifest is not None and config.resume.mode == "resume":
        old, new = _flatten(manifest["output_affecting"]), _flatten(identity["output_affecting"])
        changed = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
        if changed:
            raise OutputMismatchError(
                f"{store.root.uri} holds output made with other settings: {', '.join(changed)} changed. "
                "Use a new output URI, or --restart (resume.mode=restart) to delete the old output first."
            )
        _check_same_input(store, config, manifest, listing)
        manifest["input_files"] = listing  # the same files; their record counts are kept for the next resume
    if manifest is None or config.resume.mode == "restart":
        store.reset()
        manifest = {**identity, "attempts": []}
    attempt = len(manifest["attempts"]) + 1
    manifest["attempts"].append({"attempt": attempt, "started_at": utc_now(), "ended_at": None})
    store.write_manifest(manifest)
    return manifest, attempt


class _ShardCommitter:
    """Routes the pipeline's output to shard buffers and commits each shard the moment its last row arrives.

    Every input row of a pending shard comes back exactly once (answered, failed in the engine, or rejected by
    the validation stage), so a shard is complete when it has received as many rows as it holds. Buffers exist
    only for shards with rows in flight."""

    def __init__(
        self,
        store: OutputStore,
        config: JobConfig,
        rows_in: int,
        pending: set[int],
        types: dict[str, Any],
        attempt: int,
        metrics: RunMetrics,
        note_attempt: Callable[[], None],
    ) -> None:
        self.store, self.config, self.attempt, self.metrics = store, config, attempt, metrics
        self.note_attempt = note_attempt
        self.rows_in, self.pending, self.types = rows_in, set(pending), types
        self.buffers: dict[int, ShardBuffer] = {}
        self.commits: list[ShardCommit] = []
        self.engine_restarts = 0
        # A batch whose node was lost is rerun by Ray; rows it had already handed on can arrive twice. The first
        # answer is kept, so every row is written once, and the repeats are counted. Positions are kept per shard
        # in flight only: a row of a shard no longer pending belongs to a shard already committed.
        self.seen: dict[int, set[int]] = defaultdict(set)
        self.rows_redelivered = 0
        self.noted_at = time.monotonic()
        self.first_request_at: float | None = None

    def _buffer(self, shard: int) -> ShardBuffer:
        buffer = self.buffers.get(shard)
        if buffer is None:
            shard_rows = self.config.output.shard_rows
            size = min(shard_rows, self.rows_in - shard * shard_rows)
            buffer = self.buffers[shard] = ShardBuffer(shard, size)
        return buffer

    def _redelivered(self, shard: int, position: int) -> bool:
        seen = self.seen[shard] if shard in self.pending else None
        if seen is None or position in seen:
            self.rows_redelivered += 1
            return True
        seen.add(position)
        return False

    def commit_ready(self) -> None:
        # The attempt's time is noted after each commit, and at least every NOTE_INTERVAL_S while rows arrive.
        for shard in sorted(s for s, b in self.buffers.items() if b.complete):
            buffer = self.buffers.pop(shard)
            self.seen.pop(shard, None)
            table = buffer.table(self.types) if buffer.results else None
            self.commits.append(
                self.store.commit_shard(shard, table, buffer.error_records(), buffer.stats(), self.attempt)
            )
            self.pending.discard(shard)
            self.note()
        if time.monotonic() - self.noted_at > NOTE_INTERVAL_S:
            self.note()

    def note(self) -> None:
        self.noted_at = time.monotonic()
        self.note_attempt()

    def take(self, batch: pa.Table) -> tuple[int, int, int, int]:
        """Route one batch of pipeline output; returns (rows ok, rows failed in the engine, rows rejected by
        validation, output tokens)."""
        shard_rows, max_model_len = self.config.output.shard_rows, self.config.engine.max_model_len
        ok = failed = rejected = out_tokens = 0
        engine_batches: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for item in batch.to_pylist():
            restarts = int(item.get(ENGINE_RESTARTS_COLUMN) or 0)
            if restarts:
                self.engine_restarts += restarts
                print(
                    f"[llm-batch] the engine died and was rebuilt {restarts} time(s) while answering a batch "
                    f"({self.engine_restarts} this attempt)",
                    file=sys.stderr,
                )
            position = int(item["_pos"])
            shard = position // shard_rows
            if self._redelivered(shard, position):
                continue
            buffer = self._buffer(shard)
            buffer.received += 1
            message = item.get("__inference_error__") or ""
            if message.startswith(REJECTED_PREFIX):  # failed validation: never reached an engine
                buffer.errors.append(row_error(item, item["_error_type"], message.removeprefix(REJECTED_PREFIX)))
                rejected += 1
                continue
            engine_batches[item.get("batch_uuid") or ""].append(item)
            if message:
                buffer.errors.append(row_error(item, *classify_inference_error(message)))
                failed += 1
                continue
            num_in, num_out = int(item["num_input_tokens"]), int(item["num_generated_tokens"])
            buffer.results.append(
                {
                    "_pos": position,
                    "id": item["id"],
                    "generated_text": item["generated_text"],
                    "num_input_tokens": num_in,
                    "num_output_tokens": num_out,
                    "finish_reason": finish_reason(num_in, num_out, int(item["_max_tokens"]), max_model_len),
                    "_passthrough": passthrough_of(item.get("_passthrough")),
                }
            )
            ok += 1
            out_tokens += num_out
        for items in engine_batches.values():
            report = _batch_report(items)
            if report.rows_ok and self.first_request_at is None:
                self.first_request_at = _first_request_at(items, report)
            self.metrics.batch_complete(report)
        if rejected:
            self.metrics.rows_rejected(rejected)
        self.commit_ready()
        return ok, failed, rejected, out_tokens


def _first_request_at(items: list[dict[str, Any]], report: BatchReport) -> float:
    """When the engine that answered this batch took its first one, on this process's monotonic clock. Rows that
    carry no stamp: the batch's arrival less its time in the engine (an estimate that runs late when batches share
    the engine, as the first one to arrive need not be the first one sent)."""
    stamps = [float(i[ENGINE_FIRST_REQUEST_COLUMN]) for i in items if i.get(ENGINE_FIRST_REQUEST_COLUMN)]
    if stamps:
        return time.monotonic() - max(0.0, time.time() - min(stamps))
    return time.monotonic() - report.duration_s


def _batch_report(items: list[dict[str, Any]]) -> BatchReport:
    """One engine batch as received: its latency is its slowest row's time in the engine."""
    succeeded = [i for i in items if not i.get("__inference_error__")]
    return BatchReport(
        duration_s=max((float(i.get("time_taken_llm") or 0.0) for i in succeeded), default=0.0),
        rows_ok=len(succeeded),
        rows_failed=len(items) - len(succeeded),
        input_tokens=sum(int(i["num_input_tokens"] or 0) for i in succeeded),
        output_tokens=sum(int(i["num_generated_tokens"] or 0) for i in succeeded),
    )


def _run_engine(
    committer: _ShardCommitter,
    config: JobConfig,
    plan: InputPlan,
    progress: Progress,
    stop: Any,
    lease: OutputLease,
    timings: dict[str, float],
    memory: dict[str, float],
) -> bool:
    """Stream the pending shards' rows from the input through Ray Data LLM; returns False if stopped by a signal."""
    from workload.engine.pipeline import build_pipeline
    from workload.job.input_stream import id_pass, input_stream, stream_read_concurrency

    started = time.monotonic()
    stop.install()  # ray.init installed its own SIGTERM handler, which exits at once
    # The whole input's repeated ids and facts first: a row is sent only once no earlier row can claim its id.
    duplicates, facts = id_pass(plan, config.sampling, _partitions(), config.stages.num_cpus)
    timings["id_pass_s"] = round(time.monotonic() - started, 3)
    if stop.stopped:  # nothing is in flight yet: every pending shard is left for the next attempt
        return False
    problem = seeded_cpu_conflict(config, facts.seeded)
    if problem:  # a row's own seed meets engine settings that would crash on it: stop before any engine starts
        raise ConfigError(problem)
    committer.types = facts.types

    def rows(rejected: bool) -> Any:
        return input_stream(
            plan,
            config.sampling,
            duplicates,
            config.output.shard_rows,
            committer.pending,
            config.stages.num_cpus,
            rejected,
            stream_read_concurrency(config.max_replicas or config.replicas),
        )

    # Rows that failed validation never enter the engine's stages: they go straight to their shards.
    dataset = rows(rejected=True)
    if facts.valid_rows:
        # No model on the driver: each node running a stage fetches config.model itself
        # (workload/engine/node_stages.py).
        answered = build_pipeline(rows(False), config, chat_template=facts.has_messages, seeded=facts.seeded)
        dataset = answered.union(dataset)
    # Every ray.init (ours, and the one build_processor makes) installs a SIGTERM handler that exits at once,
    # without committing: take the signal back just before the work starts.
    stop.install()
    memory["before_stream"] = _driver_rss_mib()
    try:
        for batch in _batches_or_ticks(dataset):
            if batch is not None:
                ok, failed, rejected, out_tokens = committer.take(batch)
                if committer.first_request_at is not None and "first_engine_request_s" not in timings:
                    timings["first_answer_s"] = round(time.monotonic() - timings["t0"], 3)
                    timings["first_engine_request_s"] = round(committer.first_request_at - timings["t0"], 3)
                progress.advance(ok, failed + rejected, out_tokens)
            lease.check()  # a lost lease stops the engine work now, not only at the next commit
            if stop.stopped:
                return False
    except LeaseLostError:
        raise
    except Exception as error:
        loop = _crash_loop_in(error)
        if loop is not None:
            raise EngineCrashLoopError(loop) from None
        raise
    return True


_END = object()
TICK_S = 1.0


def _batches_or_ticks(dataset: Any) -> Iterator[pa.Table | None]:
    """The dataset's output batches, with a None at least every TICK_S while none comes.

    Ray Data can hold a task's rows until the task ends (a small input is one block, answered whole), so a loop
    that only wakes on a batch would see a SIGTERM, or a lost lease, only then: after the grace period, when the
    stop timer has hard-exited without the `_interrupted.json` note. A thread reads the batches; the caller
    wakes on each tick. At a stop the thread is left behind, blocked in Ray, and ends with the process."""
    handoff: queue.Queue[Any] = queue.Queue(maxsize=2)

    def pump() -> None:
        try:
            for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                handoff.put(batch)
            handoff.put(_END)
        except BaseException as error:  # handed to the caller's thread, which raises it as its own
            handoff.put(error)

    threading.Thread(target=pump, name="llm-batch-output", daemon=True).start()
    while True:
        try:
            item = handoff.get(timeout=TICK_S)
        except queue.Empty:
            yield None
            continue
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _partitions() -> int:
    """Hash partitions of the id pass: one per CPU of the cluster, so each node groups its share of the ids."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _crash_loop_in(error: BaseException) -> str | None:
    """The engine guard's crash-loop verdict, from under the layers Ray wraps a stage's exception in."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, EngineCrashLoopError):
            return str(current.args[0]) if current.args else str(current)
        current = current.__cause__ or current.__context__
    text = str(error)
    marker = f"{EngineCrashLoopError.__name__}: "
    if marker in text:
        return text[text.index(marker) + len(marker) :].strip().splitlines()[0]
    return None


def run_job(config: JobConfig) -> RunOutcome:
    """Take the output's lease, then run (or resume) the job; the summary is written once every shard of the input
    is committed.

    Raises LeaseHeldError (nothing touched) when another live attempt holds the output, LeaseLostError (nothing
    written after the loss) when this one loses it. Any other failure is recorded in `_failed.json` while the
    lease is still held, so the note can never land on another attempt's output.
    """
    started = time.monotonic()
    store_root = OutputStore(config.output.uri).root
    with hold_lease(store_root, config.resume.lease_ttl_s, config.resume.lease_wait_s) as lease:
        store = OutputStore(config.output.uri, guard=lease.check)
        try:
            return _run_attempt(config, store, lease, started)
        except LeaseLostError:
            raise
        except Exception as error:
            try:
                store.write_failure(type(error).__name__, str(error))
            except Exception as write_error:  # the original failure matters more than this note about it
                print(f"[llm-batch] could not record the failure: {write_error}", file=sys.stderr)
            raise


def _proc_status_mib(key: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{key}:"):
                    return round(int(line.split()[1]) / 1024, 1)  # reported in kB
    except OSError:
        pass
    return None


def _driver_peak_rss_mib() -> float:
    """The driver's own peak resident memory so far: VmHWM, which starts afresh at exec. (ru_maxrss does not: a
    process started by a large one, as pytest or a benchmark start the job, inherits its parent's peak.)"""
    peak = _proc_status_mib("VmHWM")
    return peak if peak is not None else round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _driver_rss_mib() -> float:
    """The driver's resident memory now."""
    current = _proc_status_mib("VmRSS")
    return current if current is not None else _driver_peak_rss_mib()


def _run_attempt(config: JobConfig, store: OutputStore, lease: OutputLease, started: float) -> RunOutcome:
    from workload.runtime import StopSignal, ray_session

    store.clear_notes()
    timings: dict[str, float] = {"t0": started}
    previous = store.read_manifest()
    known = previous.get("input_files") if previous and config.resume.mode == "resume" else None
    plan = plan_input(config.input, known)
    timings["plan_s"] = round(time.monotonic() - started, 3)
    # Where the driver's memory went: its peak up to the end of the plan (the only time it reads input bytes),
    # its size when the rows start to stream (Ray and the pipeline built), and its peak over the whole attempt.
    memory = {"peak_after_plan": _driver_peak_rss_mib()}
    manifest, attempt = _start_attempt(store, config, plan, previous)
    failpoints.reached(failpoints.ATTEMPT_STARTED)
    committed = store.recover()
    shard_count = -(-plan.rows_in // config.output.shard_rows)
    pending = set(range(shard_count)) - set(committed)
    timings["reopen_s"] = round(time.monotonic() - started, 3)
    run_id = config.metrics.run_id or manifest["attempts"][0]["started_at"]
    metrics = open_metrics(config.metrics, run_id)
    done_rows = sum(c.rows_ok + c.rows_failed for c in committed.values())
    progress = Progress(total=plan.rows_in, already=done_rows, attempt=attempt)
    if committed:
        print(
            f"[llm-batch] attempt {attempt}: resuming, {len(committed)}/{shard_count} shards already committed",
            file=sys.stderr,
        )

    def record_attempt() -> None:
        # Kept current while the attempt runs, so one that is killed still reports its time up to then.
        entry = manifest["attempts"][-1]
        entry["wall_s"] = round(time.monotonic() - started, 3)
        entry["engine_restarts"] = committer.engine_restarts
        entry["rows_redelivered"] = committer.rows_redelivered
        entry["driver_peak_rss_mib"] = _driver_peak_rss_mib()
        entry["driver_rss_mib"] = memory
        entry["timings_s"] = {k: v for k, v in timings.items() if k != "t0"}
        store.write_manifest(manifest)

    completed = True
    with StopSignal(config.resume.grace_period_s) as stop:
        committer = _ShardCommitter(store, config, plan.rows_in, pending, {}, attempt, metrics, record_attempt)
        if pending and not stop.stopped:
            with ray_session(config.device, preload=("workload.engine.pipeline",)):
                completed = _run_engine(committer, config, plan, progress, stop, lease, timings, memory)
            # Stopped by a signal: every shard complete so far is committed; the rest is redone next time.
            completed = completed and not committer.pending
        # The handler stays ours until the summary is written: a SIGTERM after the last commit lets the run
        # finish its bookkeeping rather than killing it halfway (the default action).
        interrupted = stop.stopped
        manifest["attempts"][-1]["ended_at"] = utc_now()
        record_attempt()
        if not completed:
            metrics.close()
            left = len(committer.pending)
            print(f"[llm-batch] stopped: {left} shards left for the next attempt", file=sys.stderr)
            if interrupted:
                store.write_interrupted(stop.signal_name or "a signal", left)
                return RunOutcome(None, interrupted=True, exit_code=StopSignal.EXIT_CODE)
            # Not a signal and not complete: rows went missing between the engine and the driver (a bug).
            store.write_failure("IncompleteRun", f"{left} shard(s) never received all their rows")
            return RunOutcome(None, interrupted=False, exit_code=1)
        # The commits are known: those recovered at the start and this attempt's own; nothing is read again.
        commits = {**committed, **{c.shard: c for c in committer.commits}}
        summary = build_summary(config, manifest, commits)
        failpoints.reached(failpoints.SUMMARY_WRITING)
        store.write_summary(summary)
        metrics.run_complete(summary)
        metrics.close()
        print_summary(summary, store.root.uri)
        return RunOutcome(summary, interrupted=False, exit_code=0)
