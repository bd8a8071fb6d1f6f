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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from workload import failpoints
from workload.contract.config import JobConfig
from workload.job.committer import ShardCommitter
from workload.job.engine_loop import Feed, run_engine
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
from workload.job.output import OutputFencedError, OutputStore, ShardCommit, utc_now
from workload.job.summary import build_summary, print_summary
from workload.telemetry.metric_sinks import open_metrics
from workload.telemetry.process_memory import peak_rss_mib


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
            record_failure(store, error)
            raise


def record_failure(store: OutputStore, error: BaseException) -> None:
    """`_failed.json` naming `error`, best effort: the original failure matters more than this note about it."""
    try:
        store.write_failure(type(error).__name__, str(error))
    except Exception as write_error:
        print(f"[llm-batch] could not record the failure: {write_error}", file=sys.stderr)


def _run_attempt(config: JobConfig, store: OutputStore, lease: OutputLease, started: float) -> RunOutcome:
    from workload.runtime import StopSignal, ray_session

    attempt = Attempt(config, store, started)
    attempt.prepare()
    completed = True
    with StopSignal(config.resume.grace_period_s) as stop:
        # An uncounted plan needs the id pass for its shards; a counted one, for what is still pending.
        if attempt.needs_engine and not stop.stopped:
            with ray_session(config.device, preload=("workload.engine.pipeline",), stopped=stop.event):
                completed = run_engine(
                    [attempt.feed()], attempt.config, stop, lease.check, attempt.timings, attempt.memory
                )
        # The handler stays ours until the summary is written: a SIGTERM after the last commit lets the run
        # finish its bookkeeping rather than killing it halfway (the default action).
        return attempt.end(completed, stop)


class Attempt:
    """One output's attempt from its plan to its summary: the lone job runs one; a pool one per member, all fed by
    one engine (workload/job/pool.py).

    `clock` gives the attempt's wall time, which its summary's `wall_s` and `cost_usd` sum: the lone job's own
    time since it started; a pool member's share of the pool's (`share_basis` names how it is apportioned)."""

    def __init__(
        self,
        config: JobConfig,
        store: OutputStore,
        started: float,
        clock: Callable[[], float] | None = None,
        share_basis: str | None = None,
    ) -> None:
        self.config, self.store, self.started = config, store, started
        self.clock = clock or (lambda: time.monotonic() - started)
        self.share_basis = share_basis
        self.timings: dict[str, float] = {"t0": started}
        # Where the driver's memory went: its peak up to the end of the plan (it lists the input and reads no rows),
        # its size when the rows start to stream (Ray and the pipeline built), and its peak over the whole attempt.
        self.memory: dict[str, float] = {}
        self.outcome: RunOutcome | None = None  # set once the attempt has ended (a pool member may end early)

    def prepare(self) -> None:
        """Plan the input, claim the output (refusing to mix: OutputMismatchError), recover its commits."""
        config, store, started = self.config, self.store, self.started
        previous = store.read_manifest()
        known = previous.get("input_files") if previous and config.resume.mode == "resume" else None
        model = config.model
        plan = plan_input(config.input, known, model.names(), config.task, model.tools, model.adapter_names())
        # Before the claim: a re-uploaded file's digest decides whether this is still the output's input.
        plan = hash_moved_files(plan, known)
        if plan.task != config.task:  # an OpenAI /v1/embeddings input: the task, and so the config hash, is embed
            config = self.config = config.model_copy(update={"task": plan.task})
        if plan.task == "embed":
            from workload.engine.embed import check_can_embed

            check_can_embed(config.model)  # before the manifest: a model that cannot pool leaves the output untouched
        self.timings["plan_s"] = round(time.monotonic() - started, 3)
        self.memory["peak_after_plan"] = peak_rss_mib()
        self.manifest, self.number = _claim(store, config, plan, previous)
        failpoints.reached(failpoints.ATTEMPT_STARTED)
        self.committed = store.recover()
        self.timings["reopen_s"] = round(time.monotonic() - started, 3)
        run_id = config.metrics.run_id or self.manifest["attempts"][0]["started_at"]
        self.metrics = open_metrics(config.metrics, run_id)
        self.done_rows = sum(c.rows_ok + c.rows_failed for c in self.committed.values())
        self.plan = plan  # the counted plan once the id pass has counted the input
        self.committer = ShardCommitter(store, config, 0, set(), {}, self.number, self.metrics, self.record)
        self.committer.verify_input = lambda shard: verify_unchanged(
            self.plan.files_with({shard}, config.output.shard_rows)
        )
        if plan.task == "embed" and plan.openai is not None:
            self.committer.layout = "embed_several"  # an OpenAI line may carry several inputs
        if plan.counted:  # the manifest's counts: the shards are known before any read
            self.set_shards(plan)

    @property
    def needs_engine(self) -> bool:
        """An uncounted plan needs the id pass for its shards; a counted one, for what is still pending."""
        return bool(self.committer.pending) or not self.plan.counted

    @property
    def complete(self) -> bool:
        return self.plan.counted and not self.committer.pending

    def feed(self, finished: Callable[[], None] | None = None) -> Feed:
        feed = Feed(self.committer, self.config, self.plan, self.set_shards, self.done_rows, self.number)
        if finished is not None:
            feed.finished = finished
        return feed

    def shards_of(self, counted: InputPlan) -> int:
        return -(-int(counted.rows_in or 0) // self.config.output.shard_rows)

    def record(self) -> None:
        """The attempt's entry in the manifest; kept current while the attempt runs, so one that is killed still
        reports its time up to then."""
        entry = self.manifest["attempts"][-1]
        entry["wall_s"] = round(self.clock(), 3)
        if self.share_basis is not None:
            entry["share_basis"] = self.share_basis
        entry["engine_restarts"] = self.committer.engine_restarts
        entry["engine_calibration"] = sorted(self.committer.engine_calibration)
        entry["rows_redelivered"] = self.committer.rows_redelivered
        entry["driver_peak_rss_mib"] = peak_rss_mib()
        entry["driver_rss_mib"] = self.memory
        entry["timings_s"] = {k: v for k, v in self.timings.items() if k != "t0"}
        self.store.write_manifest(self.manifest)

    def set_shards(self, counted: InputPlan) -> None:
        """The counts (the manifest's, or the id pass's): recorded in the manifest, so a resume plans its shards
        without a read, and the shards still to do."""
        announce = not self.plan.counted or self.plan is counted
        self.plan = counted
        manifest = self.manifest
        if counted.listing() != manifest.get("input_files") or manifest.get("rows_in") != counted.rows_in:
            manifest.update(input_files=counted.listing(), rows_in=counted.rows_in)
            self.store.write_manifest(manifest)
        self.committer.rows_in = int(counted.rows_in or 0)
        self.committer.pending = set(range(self.shards_of(counted))) - set(self.committed)
        if self.committed and announce:
            which = f"{self.store.root.uri} " if self.share_basis is not None else ""  # a pool names its member
            print(
                f"[llm-batch] {which}attempt {self.number}: resuming, {len(self.committed)}/"
                f"{self.shards_of(counted)} shards already committed",
                file=sys.stderr,
            )

    def commits(self) -> dict[int, ShardCommit]:
        """Those recovered at the start and this attempt's own; nothing is read again."""
        return {**self.committed, **{c.shard: c for c in self.committer.commits}}

    def end(self, completed: bool, stop: Any) -> RunOutcome:
        """The attempt's end: the summary once every shard is committed, else the stop's note (or the failure)."""
        if self.outcome is None:
            self.outcome = self._end(completed and self.complete, stop)
        return self.outcome

    def _end(self, completed: bool, stop: Any) -> RunOutcome:
        from workload.runtime import StopSignal

        store, config, manifest, plan = self.store, self.config, self.manifest, self.plan
        interrupted = stop.stopped
        manifest["attempts"][-1]["ended_at"] = utc_now()
        self.record()
        if not completed:
            self.metrics.close()
            # Stopped before the id pass counted the input: every shard is left (how many is not known yet).
            left = len(self.committer.pending) if plan.counted else None
            print(
                f"[llm-batch] stopped: {'all' if left is None else left} shards left for the next attempt",
                file=sys.stderr,
            )
            if interrupted:
                if plan.openai is not None:  # what finished so far, in OpenAI's files; the next attempt rewrites them
                    _openai_files(store, self.commits(), config, manifest)
                store.write_interrupted(stop.signal_name or "a signal", left)
                return RunOutcome(None, interrupted=True, exit_code=StopSignal.EXIT_CODE)
            # Not a signal and not complete: rows went missing between the engine and the driver (a bug).
            store.write_failure("IncompleteRun", f"{left} shard(s) never received all their rows")
            return RunOutcome(None, interrupted=False, exit_code=1)
        commits = self.commits()
        summary = build_summary(config, manifest, commits)
        if self.share_basis is not None:
            summary["share_basis"] = self.share_basis
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
        self.metrics.run_complete(summary)
        self.metrics.close()
        print_summary(summary, store.root.uri)
        return RunOutcome(summary, interrupted=False, exit_code=0)
