"""One run of the batch job: lease, validate, resume, stream rows through the pipeline, commit shard by shard,
summarise.

The driver owns the input and the commits; Ray runs the stages. Rows are numbered by their place in the input and
grouped into fixed shards of `output.shard_rows`, so every attempt agrees on which row belongs to which shard and a
rerun sends the engine only the rows of shards not yet committed. Before anything else the attempt takes the
output's lease (workload/lease.py), so two attempts never write one output at once; an attempt that loses it
stops before its next write.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from workload import failpoints
from workload.config import ConfigError, JobConfig, seeded_cpu_conflict
from workload.lease import LeaseLostError, OutputLease, hold_lease
from workload.metric_sinks import open_metrics
from workload.metrics import BatchReport, RunMetrics
from workload.output import OutputStore, ShardCommit, utc_now
from workload.progress import Progress
from workload.results import (
    ENGINE_RESTARTS_COLUMN,
    EngineCrashLoopError,
    ShardBuffer,
    classify_inference_error,
    finish_reason,
    passthrough_types,
)
from workload.rows import ValidatedInput, ValidRow, input_files, read_input
from workload.storage import content_version
from workload.summary import build_summary, print_summary

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


def _input_listing(config: JobConfig) -> dict[str, dict[str, Any]]:
    """Each input file's size and content version (S3 ETag, local mtime): what the output was made from."""
    listing = {}
    for file in input_files(config.input):
        size, version = content_version(file)
        listing[file.uri] = {"size": size, "version": version}
    return listing


def _fingerprint(listing: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()[:16]


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
        elif old[uri] != new[uri]:
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


def _start_attempt(store: OutputStore, config: JobConfig, rows_in: int) -> tuple[dict[str, Any], int]:
    """Check the output against this config (refusing to mix), then record a new attempt."""
    manifest = store.read_manifest()
    listing = _input_listing(config)
    identity = {
        "config_hash": config.output_hash(),
        "output_affecting": config.output_affecting(),
        "input_fingerprint": _fingerprint(listing),
        "input_files": listing,
        "rows_in": rows_in,
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
    if manifest is None or config.resume.mode == "restart":
        store.reset()
        manifest = {**identity, "attempts": []}
    attempt = len(manifest["attempts"]) + 1
    manifest["attempts"].append({"attempt": attempt, "started_at": utc_now(), "ended_at": None})
    store.write_manifest(manifest)
    return manifest, attempt


class _ShardCommitter:
    """Routes engine output to shard buffers and commits each shard the moment its last row arrives."""

    def __init__(
        self,
        store: OutputStore,
        config: JobConfig,
        validated: ValidatedInput,
        pending: set[int],
        attempt: int,
        metrics: RunMetrics,
        note_attempt: Callable[[], None],
    ) -> None:
        self.store, self.config, self.attempt, self.metrics = store, config, attempt, metrics
        self.note_attempt = note_attempt
        shard_rows = config.output.shard_rows
        self.rows_by_pos = {r.position: r for r in validated.rows}
        self.types = passthrough_types(validated.rows)
        self.buffers = {shard: ShardBuffer(shard, 0) for shard in pending}
        for row in validated.rows:
            if row.position // shard_rows in pending:
                self.buffers[row.position // shard_rows].expected += 1
        for error in validated.errors:
            if error.position // shard_rows in pending:
                self.buffers[error.position // shard_rows].errors.append(error)
        self.commits: list[ShardCommit] = []
        self.engine_restarts = 0
        # A batch whose node was lost is rerun by Ray; rows it had already handed on can arrive twice. The first
        # answer is kept, so every row is written once, and the repeats are counted.
        self.seen: set[int] = set()
        self.rows_redelivered = 0
        self.noted_at = time.monotonic()

    def engine_rows(self) -> list[ValidRow]:
        shard_rows = self.config.output.shard_rows
        return [r for r in self.rows_by_pos.values() if r.position // shard_rows in self.buffers]

    def commit_ready(self) -> None:
        # The attempt's time is noted after each commit, and at least every NOTE_INTERVAL_S while rows arrive.
        for shard in sorted(s for s, b in self.buffers.items() if b.complete):
            buffer = self.buffers.pop(shard)
            table = buffer.table(self.rows_by_pos, self.types) if buffer.results else None
            self.commits.append(
                self.store.commit_shard(shard, table, buffer.error_records(), buffer.stats(), self.attempt)
            )
            self.note()
        if time.monotonic() - self.noted_at > NOTE_INTERVAL_S:
            self.note()

    def note(self) -> None:
        self.noted_at = time.monotonic()
        self.note_attempt()

    def take(self, batch: pa.Table) -> tuple[int, int, int]:
        """Route one batch of engine output; returns (rows ok, rows failed, output tokens)."""
        shard_rows, max_model_len = self.config.output.shard_rows, self.config.engine.max_model_len
        ok = failed = out_tokens = 0
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
            if item["_pos"] in self.seen:
                self.rows_redelivered += 1
                continue
            self.seen.add(item["_pos"])
            row = self.rows_by_pos[item["_pos"]]
            buffer = self.buffers[row.position // shard_rows]
            buffer.received += 1
            engine_batches[item.get("batch_uuid") or ""].append(item)
            message = item.get("__inference_error__") or ""
            if message:
                buffer.errors.append(row.failed(*classify_inference_error(message)))
                failed += 1
                continue
            num_in, num_out = int(item["num_input_tokens"]), int(item["num_generated_tokens"])
            buffer.results.append(
                {
                    "_pos": row.position,
                    "id": row.id,
                    "generated_text": item["generated_text"],
                    "num_input_tokens": num_in,
                    "num_output_tokens": num_out,
                    "finish_reason": finish_reason(num_in, num_out, row.sampling["max_tokens"], max_model_len),
                }
            )
            ok += 1
            out_tokens += num_out
        for items in engine_batches.values():
            self.metrics.batch_complete(_batch_report(items))
        self.commit_ready()
        return ok, failed, out_tokens


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
    committer: _ShardCommitter, config: JobConfig, progress: Progress, stop: Any, lease: OutputLease
) -> bool:
    """Stream the pending rows through Ray Data LLM; returns False if stopped by a signal."""
    import ray.data

    from workload.pipeline import build_pipeline, engine_input, input_blocks

    rows = committer.engine_rows()
    if not rows:
        return True
    table = engine_input(
        [r.position for r in rows],
        [r.prompt for r in rows],
        [r.messages for r in rows],
        [r.sampling for r in rows],
        [r.id for r in rows],
    )
    blocks = input_blocks(table, config.batch_size)
    has_messages = any(row.messages is not None for row in rows)
    # No model on the driver: each node running a stage fetches config.model itself (workload/node_stages.py).
    dataset = build_pipeline(ray.data.from_arrow(blocks), config, chat_template=has_messages, seeded=_seeded(rows))
    # Every ray.init (ours, and the one build_processor makes) installs a SIGTERM handler that exits at once,
    # without committing: take the signal back just before the work starts.
    stop.install()
    try:
        for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            ok, failed, out_tokens = committer.take(batch)
            progress.advance(ok, failed, out_tokens)
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


def _seeded(rows: list[ValidRow]) -> bool:
    return any(row.sampling.get("seed") is not None for row in rows)


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


def _run_attempt(config: JobConfig, store: OutputStore, lease: OutputLease, started: float) -> RunOutcome:
    from workload.runtime import StopSignal, ray_session

    store.clear_notes()
    validated = read_input(config.input, config.sampling)
    problem = seeded_cpu_conflict(config, _seeded(validated.rows))
    if problem:  # a row's own seed meets engine settings that would crash on it: stop before any work
        raise ConfigError(problem)
    manifest, attempt = _start_attempt(store, config, validated.rows_in)
    failpoints.reached(failpoints.ATTEMPT_STARTED)
    committed = store.recover()
    shard_count = -(-validated.rows_in // config.output.shard_rows)
    pending = set(range(shard_count)) - set(committed)
    run_id = config.metrics.run_id or manifest["attempts"][0]["started_at"]
    metrics = open_metrics(config.metrics, run_id)
    done_rows = sum(c.rows_ok + c.rows_failed for c in committed.values())
    progress = Progress(total=validated.rows_in, already=done_rows, attempt=attempt)
    if committed:
        print(
            f"[llm-batch] attempt {attempt}: resuming, {len(committed)}/{shard_count} shards already committed",
            file=sys.stderr,
        )

    def record_attempt() -> None:
        # Kept current while the attempt runs, so one that is killed still reports its time up to then.
        manifest["attempts"][-1]["wall_s"] = round(time.monotonic() - started, 3)
        manifest["attempts"][-1]["engine_restarts"] = committer.engine_restarts
        manifest["attempts"][-1]["rows_redelivered"] = committer.rows_redelivered
        store.write_manifest(manifest)

    completed = True
    with StopSignal(config.resume.grace_period_s) as stop:
        committer = _ShardCommitter(store, config, validated, pending, attempt, metrics, record_attempt)
        rejected = sum(len(b.errors) for b in committer.buffers.values())
        progress.advance(0, rejected, 0)
        metrics.rows_rejected(rejected)
        committer.commit_ready()  # shards with no valid rows (only bad ones) commit at once
        if committer.buffers and not stop.stopped:
            with ray_session(config.device):
                completed = _run_engine(committer, config, progress, stop, lease)
            # Stopped by a signal: every shard complete so far is committed; the rest is redone next time.
            completed = completed and not committer.buffers
        # The handler stays ours until the summary is written: a SIGTERM after the last commit lets the run
        # finish its bookkeeping rather than killing it halfway (the default action).
        interrupted = stop.stopped
        manifest["attempts"][-1]["ended_at"] = utc_now()
        record_attempt()
        if not completed:
            metrics.close()
            left = len(committer.buffers)
            print(f"[llm-batch] stopped: {left} shards left for the next attempt", file=sys.stderr)
            if interrupted:
                store.write_interrupted(stop.signal_name or "a signal", left)
                return RunOutcome(None, interrupted=True, exit_code=StopSignal.EXIT_CODE)
            # Not a signal and not complete: rows went missing between the engine and the driver (a bug).
            store.write_failure("IncompleteRun", f"{left} shard(s) never received all their rows")
            return RunOutcome(None, interrupted=False, exit_code=1)
        summary = build_summary(config, manifest, store.committed())
        failpoints.reached(failpoints.SUMMARY_WRITING)
        store.write_summary(summary)
        metrics.run_complete(summary)
        metrics.close()
        print_summary(summary, store.root.uri)
        return RunOutcome(summary, interrupted=False, exit_code=0)
