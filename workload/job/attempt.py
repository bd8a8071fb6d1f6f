"""One run of the batch job: lease, plan the input, resume, stream rows through the pipeline, commit shard by
shard, summarise.

The cluster reads and validates the input (workload/job/input_stream.py); the driver holds the plan (per file), the
shards in flight and the commits (per shard), never the rows. Each file's record count, from the id pass (the
attempt's first read of the input) or the manifest, numbers every row by its place in the input, and rows are
grouped into fixed shards of `output.shard_rows`, so every attempt
agrees on which row belongs to which shard and a rerun reads and sends the engine only the rows of shards not yet
committed. Before anything else the attempt takes the output's lease (workload/job/lease.py), so two attempts never
write one output at once; an attempt that loses it stops before its next write.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from workload import failpoints
from workload.contract.config import JobConfig
from workload.job.committer import ShardCommitter
from workload.job.engine_loop import run_engine
from workload.job.input_plan import (
    InputPlan,
    files_after_plan,
    hash_moved_files,
    input_changes,
    plan_input,
    verify_unchanged,
)
from workload.job.lease import LeaseLostError, OutputLease, hold_lease
from workload.job.openai_files import build_openai_files
from workload.job.output import OutputFencedError, OutputStore, utc_now
from workload.job.summary import build_summary, print_summary
from workload.telemetry.metric_sinks import open_metrics
from workload.telemetry.process_memory import peak_rss_mib
from workload.telemetry.progress import Progress


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
    """What `input_fingerprint` holds of a file: its size and content version. A resume compares the listing
    itself, by size and digest (input_plan.input_changes); the fingerprint serves outputs older than the listing."""
    return {"size": entry["size"], "version": entry["version"]}


def _fingerprint(listing: dict[str, dict[str, Any]]) -> str:
    identities = {uri: _identity(entry) for uri, entry in listing.items()}
    return hashlib.sha256(json.dumps(identities, sort_keys=True).encode()).hexdigest()[:16]


def _legacy_fingerprint(listing: dict[str, dict[str, Any]]) -> str:
    """The fingerprint of outputs made before content versions were recorded: names and sizes only."""
    pairs = [(uri, entry["size"]) for uri, entry in sorted(listing.items())]
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]


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
    changed = input_changes(recorded, listing)
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
    # Only now, with every check passed: a refused rerun leaves the rows and manifest as it found them. The manifest
    # is this attempt's first change (a conditional write: the fence, see workload/job/output.py).
    if manifest is None or config.resume.mode == "restart":
        manifest = store.reset({**identity, "attempts": []})
    attempt = len(manifest["attempts"]) + 1
    manifest["attempts"].append({"attempt": attempt, "started_at": utc_now(), "ended_at": None})
    store.write_manifest(manifest)
    store.clear_notes()
    return manifest, attempt


def _openai_files(
    store: OutputStore, commits: dict[int, Any], config: JobConfig, manifest: dict[str, Any]
) -> dict[str, int]:
    """output.jsonl and errors.jsonl, and their line counts (the summary keeps them: the Batch API's close reads
    them there rather than reading the files again)."""
    # `created` is the night's first start: a rebuild of the files writes the same bytes.
    started_at = datetime.fromisoformat(manifest["attempts"][0]["started_at"])
    output, error = build_openai_files(store, commits, config.model.name, int(started_at.timestamp()))
    return {"output_lines": output, "error_lines": error}


def _claim(
    store: OutputStore, config: JobConfig, plan: InputPlan, manifest: dict[str, Any] | None
) -> tuple[dict[str, Any], int]:
    """Start the attempt; once more if the manifest changed since it was read. That happens only when a stalled
    attempt's last request lands after this one took the lease: it can land once, and after it nothing more."""
    try:
        return _start_attempt(store, config, plan, manifest)
    except OutputFencedError as error:
        print(
            f"[llm-batch] the manifest changed while this attempt planned ({error}); reading it again", file=sys.stderr
        )
        return _start_attempt(store, config, plan, store.read_manifest())


def run_job(config: JobConfig) -> RunOutcome:
    """Take the output's lease, then run (or resume) the job; the summary is written once every shard of the input
    is committed.

    Raises LeaseHeldError (nothing touched) when another live attempt holds the output, LeaseLostError (nothing
    written after the loss) when this one loses it. Any other failure is recorded in `_failed.json` while the
    lease is still held, so the note can never land on another attempt's output. That includes a refusal
    (OutputMismatchError: the settings or input changed), which leaves the output's rows and manifest as they were
    and names what changed in the note: a scheduler that waits for the output's markers (the nightly machines of
    every tier, the Batch API) ends the run at once, by name, rather than starting the job again and again
    (issue 59). The next attempt's start removes the note, so a rerun with the output's settings resumes.
    """
    started = time.monotonic()
    store_root = OutputStore(config.output.uri).root
    with hold_lease(store_root, config.resume.lease_ttl_s, config.resume.lease_wait_s) as lease:
        store = OutputStore(config.output.uri, guard=lease.check)
        try:
            return _run_attempt(config, store, lease, started)
        except LeaseLostError:  # lost: the output is not ours to write on
            raise
        except Exception as error:
            try:
                store.write_failure(type(error).__name__, str(error))
            except Exception as write_error:  # the original failure matters more than this note about it
                print(f"[llm-batch] could not record the failure: {write_error}", file=sys.stderr)
            raise


def _run_attempt(config: JobConfig, store: OutputStore, lease: OutputLease, started: float) -> RunOutcome:
    from workload.runtime import StopSignal, ray_session

    timings: dict[str, float] = {"t0": started}
    previous = store.read_manifest()
    known = previous.get("input_files") if previous and config.resume.mode == "resume" else None
    model = config.model
    plan = plan_input(config.input, known, model.names(), config.task, model.tools, model.adapter_names())
    # Before the claim: a re-uploaded file's digest decides whether this is still the output's input.
    plan = hash_moved_files(plan, known)
    if plan.task != config.task:  # an OpenAI /v1/embeddings input: the task, and so the config hash, is embed
        config = config.model_copy(update={"task": plan.task})
    if plan.task == "embed":
        from workload.engine.embed import check_can_embed

        check_can_embed(config.model)  # before the manifest: a model that cannot pool leaves the output untouched
    timings["plan_s"] = round(time.monotonic() - started, 3)
    # Where the driver's memory went: its peak up to the end of the plan (it lists the input and reads no rows),
    # its size when the rows start to stream (Ray and the pipeline built), and its peak over the whole attempt.
    memory = {"peak_after_plan": peak_rss_mib()}
    manifest, attempt = _claim(store, config, plan, previous)
    failpoints.reached(failpoints.ATTEMPT_STARTED)
    committed = store.recover()
    timings["reopen_s"] = round(time.monotonic() - started, 3)
    run_id = config.metrics.run_id or manifest["attempts"][0]["started_at"]
    metrics = open_metrics(config.metrics, run_id)
    done_rows = sum(c.rows_ok + c.rows_failed for c in committed.values())
    current = {"plan": plan}  # the counted plan once the id pass has counted the input

    def shards_of(counted: InputPlan) -> int:
        return -(-int(counted.rows_in or 0) // config.output.shard_rows)

    def record_attempt() -> None:
        # Kept current while the attempt runs, so one that is killed still reports its time up to then.
        entry = manifest["attempts"][-1]
        entry["wall_s"] = round(time.monotonic() - started, 3)
        entry["engine_restarts"] = committer.engine_restarts
        entry["engine_calibration"] = sorted(committer.engine_calibration)
        entry["rows_redelivered"] = committer.rows_redelivered
        entry["driver_peak_rss_mib"] = peak_rss_mib()
        entry["driver_rss_mib"] = memory
        entry["timings_s"] = {k: v for k, v in timings.items() if k != "t0"}
        store.write_manifest(manifest)

    def set_shards(counted: InputPlan) -> None:
        """The counts (the manifest's, or the id pass's): recorded in the manifest, so a resume plans its shards
        without a read, and the shards still to do."""
        announce = not current["plan"].counted or current["plan"] is counted
        current["plan"] = counted
        if counted.listing() != manifest.get("input_files") or manifest.get("rows_in") != counted.rows_in:
            manifest.update(input_files=counted.listing(), rows_in=counted.rows_in)
            store.write_manifest(manifest)
        committer.rows_in = int(counted.rows_in or 0)
        committer.pending = set(range(shards_of(counted))) - set(committed)
        if committed and announce:
            print(
                f"[llm-batch] attempt {attempt}: resuming, {len(committed)}/{shards_of(counted)} shards already "
                "committed",
                file=sys.stderr,
            )

    def count(counted: InputPlan) -> Progress:
        """The id pass's counts set the shards; the attempt's progress counts rows from then on."""
        set_shards(counted)
        return Progress(total=committer.rows_in, already=done_rows, attempt=attempt)

    completed = True
    with StopSignal(config.resume.grace_period_s) as stop:
        committer = ShardCommitter(store, config, 0, set(), {}, attempt, metrics, record_attempt)
        committer.verify_input = lambda shard: verify_unchanged(
            current["plan"].files_with({shard}, config.output.shard_rows)
        )
        if plan.task == "embed" and plan.openai is not None:
            committer.layout = "embed_several"  # an OpenAI line may carry several inputs
        if plan.counted:  # the manifest's counts: the shards are known before any read
            set_shards(plan)
        # An uncounted plan needs the id pass for its shards; a counted one, for what is still pending.
        if (committer.pending or not plan.counted) and not stop.stopped:
            with ray_session(config.device, preload=("workload.engine.pipeline",), stopped=stop.event):
                completed = run_engine(committer, config, plan, count, stop, lease, timings, memory)
            # Stopped by a signal: every shard complete so far is committed; the rest is redone next time.
            completed = completed and current["plan"].counted and not committer.pending
        # The handler stays ours until the summary is written: a SIGTERM after the last commit lets the run
        # finish its bookkeeping rather than killing it halfway (the default action).
        interrupted = stop.stopped
        manifest["attempts"][-1]["ended_at"] = utc_now()
        record_attempt()
        plan = current["plan"]
        if not completed:
            metrics.close()
            # Stopped before the id pass counted the input: every shard is left (how many is not known yet).
            left = len(committer.pending) if plan.counted else None
            print(
                f"[llm-batch] stopped: {'all' if left is None else left} shards left for the next attempt",
                file=sys.stderr,
            )
            if interrupted:
                if plan.openai is not None:  # what finished so far, in OpenAI's files; the next attempt rewrites them
                    _openai_files(store, {**committed, **{c.shard: c for c in committer.commits}}, config, manifest)
                store.write_interrupted(stop.signal_name or "a signal", left)
                return RunOutcome(None, interrupted=True, exit_code=StopSignal.EXIT_CODE)
            # Not a signal and not complete: rows went missing between the engine and the driver (a bug).
            store.write_failure("IncompleteRun", f"{left} shard(s) never received all their rows")
            return RunOutcome(None, interrupted=False, exit_code=1)
        # The commits are known: those recovered at the start and this attempt's own; nothing is read again.
        commits = {**committed, **{c.shard: c for c in committer.commits}}
        summary = build_summary(config, manifest, commits)
        late = files_after_plan(config.input, plan)
        if late:
            # Uploaded after the plan was made: not part of this run; named, never silently left out.
            summary["input_files_after_plan"] = late
            print(
                f"[llm-batch] {len(late)} input file(s) appeared after the plan and were not read: {', '.join(late)}",
                file=sys.stderr,
            )
        # Before the summary: a reader that waits for summary.json finds the OpenAI files there too.
        if plan.openai is not None:
            summary["openai_files"] = _openai_files(store, commits, config, manifest)
        failpoints.reached(failpoints.SUMMARY_WRITING)
        store.write_summary(summary)
        metrics.run_complete(summary)
        metrics.close()
        print_summary(summary, store.root.uri)
        return RunOutcome(summary, interrupted=False, exit_code=0)
