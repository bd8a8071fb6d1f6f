"""Pool mode (issue 62): several batches ("members") on one engine, in one job process and one Ray session.

The job is in pool mode when `input.uri` names a `.pool.json` file:
    {"pool": "<id>", "members": [{"name": "<batch id>", "input": "<OpenAI Batch file>", "output": "<folder>",
                                  "image_files": {"<file id>": "<uri>"} | null}, ...]}
Every member runs with the config's settings but for its input, its output and its `input.image_files`, and its
output folder is exactly what a lone job over its input writes (workload/job/output.py): each member has its own
lease, plan and id pass, manifest claim, recover and ShardCommitter (`attempt.Attempt`, the lone job's own), its
shards numbered within it. So a member's output resumes under a later pool or a lone job alike, and the Batch
API reads it as it reads a lone batch's. The members stay apart because everything the commit protocol trusts
is per output: custom_ids repeat across members, shard numbers start at 0 in each.

Only the engine is shared: the rows of every member go through one pipeline, each tagged with its member's
index (engine_loop.MEMBER_COLUMN), which the driver reads to route a table's rows to their member's committer
and strips before the commit. A member whose every shard is committed is finished at once (summary.json, and
OpenAI's output.jsonl/errors.jsonl), while the others run on.

The pool's own folder (`output.uri`) holds the pool's lease and its notes, as a lone job's output holds its
own: summary.json once every member is finished ({"pool", "members": {name: "completed" | "failed: <why>"},
"finished_at"}), `_interrupted.json` on SIGTERM, `_failed.json` when the pool fails. A member refused before any
work (its output made with other settings or another input, its input unreadable) gets its own `_failed.json`
and the others go on; a failure of the engine fails the pool and every unfinished member.

Time and cost: a member's `wall_s` (and so `cost_usd`) is its share of the pool's time, apportioned by the tokens
(input + output) each member committed in this run (`share_basis: "tokens"` in its summary; `_Pool.share`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workload.contract.config import ConfigError, JobConfig
from workload.files.storage import StorageError, locate, read_bytes
from workload.job.attempt import Attempt, RunOutcome, record_failure
from workload.job.lease import LeaseHeldError, LeaseLostError, OutputLease, hold_lease
from workload.job.output import OutputStore, utc_now

POOL_SUFFIX = ".pool.json"
SHARE_BASIS = "tokens"


def is_pool(input_uri: str) -> bool:
    return input_uri.endswith(POOL_SUFFIX)


class PoolMember(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The batch's id; the pool's summary names the member by it.")
    input: str = Field(min_length=1, description="The member's OpenAI Batch input file (local path or s3:// URI).")
    output: str = Field(min_length=1, description="The member's output folder: what a lone job over it writes.")
    image_files: dict[str, str] | None = Field(None, description="The member's input.image_files (file id -> URI).")


def _folder(uri: str) -> str:
    return uri.rstrip("/")


class PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str = Field(min_length=1, description="The pool's id.")
    members: list[PoolMember] = Field(min_length=1, description="The batches, in the order given.")

    @model_validator(mode="after")
    def _apart(self) -> PoolSpec:
        names = [m.name for m in self.members]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"members: duplicate names {repeated}")
        outputs = [_folder(m.output) for m in self.members]
        for index, output in enumerate(outputs):
            # One output, one member: two members writing one folder would commit each other's shards.
            for other in outputs[index + 1 :]:
                if output == other or other.startswith(output + "/") or output.startswith(other + "/"):
                    raise ValueError(f"members: outputs {output!r} and {other!r} overlap (duplicate outputs)")
        # A file id names one upload: the one pipeline resolves every member's ids through one mapping.
        seen: dict[str, str] = {}
        for member in self.members:
            for file_id, where in (member.image_files or {}).items():
                if seen.setdefault(file_id, where) != where:
                    raise ValueError(f"members: image file {file_id!r} is mapped to {seen[file_id]!r} and {where!r}")
        return self


def read_spec(uri: str, pool_output: str) -> PoolSpec:
    """The pool's spec, validated; ConfigError names the problem (before any lease or work)."""
    try:
        value = json.loads(read_bytes(locate(uri)))
    except (OSError, StorageError) as error:
        raise ConfigError(f"{uri}: cannot read the pool spec: {error}") from None
    except ValueError as error:
        raise ConfigError(f"{uri}: the pool spec is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{uri}: the pool spec is not a JSON object")
    try:
        spec = PoolSpec.model_validate(value)
    except ValidationError as error:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in error.errors()]
        raise ConfigError(f"{uri}: invalid pool spec:\n" + "\n".join(lines)) from None
    for member in spec.members:
        if _folder(member.output) == _folder(pool_output):
            raise ConfigError(f"{uri}: member {member.name!r}: its output is the pool's output ({pool_output})")
    return spec


def member_config(config: JobConfig, member: PoolMember) -> JobConfig:
    """The config a lone job over the member's input would run with (validated as the job's config is)."""
    data = config.model_dump()
    data["input"] = {**data["input"], "uri": member.input, "image_files": member.image_files}
    data["output"] = {**data["output"], "uri": member.output}
    try:
        return JobConfig.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())
        raise ConfigError(f"pool member {member.name!r}: {problems}") from None


@dataclass
class _Member:
    name: str
    config: JobConfig
    lease: OutputLease | None = None
    store: OutputStore | None = None
    attempt: Attempt | None = None
    status: str | None = None  # "completed" | "interrupted" | "failed: <why>"; None while it runs

    def committed_tokens(self) -> int:
        """Tokens (input + output) this member committed in this run: its weight in the pool's time."""
        if self.attempt is None:  # set only once its plan and claim passed: it has a committer
            return 0
        return sum(c.input_tokens + c.output_tokens for c in self.attempt.committer.commits)


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text.splitlines()[0] if text.strip() else type(error).__name__


class _Pool:
    def __init__(self, config: JobConfig, spec: PoolSpec, store: OutputStore, lease: OutputLease, started: float):
        self.config, self.spec, self.store, self.lease, self.started = config, spec, store, lease, started
        self.members = [_Member(m.name, member_config(config, m)) for m in spec.members]
        self.timings: dict[str, float] = {"t0": started}
        self.memory: dict[str, float] = {}
        self.charged = 0.0  # the pool's time charged to members already finished (their wall_s in this run)

    def share(self, member: _Member) -> float:
        """The member's share of the pool's time so far: the time not yet charged to a finished member, split
        among the members still running by the tokens each committed in this run. A member's share is fixed when
        it finishes, so the members' times add up to the pool's, and none is charged twice."""
        running = [m for m in self.members if m.attempt is not None and m.status is None]
        total = sum(m.committed_tokens() for m in running)
        elapsed = time.monotonic() - self.started - self.charged
        return max(0.0, elapsed) * member.committed_tokens() / total if total else 0.0

    def open(self, member: _Member, held: contextlib.ExitStack) -> None:
        """The member's lease, then its attempt's plan and claim; a refusal is the member's, not the pool's."""
        config = member.config
        try:
            member.lease = held.enter_context(
                hold_lease(OutputStore(config.output.uri).root, config.resume.lease_ttl_s, config.resume.lease_wait_s)
            )
        except LeaseHeldError as error:  # another process runs this member: its output is not ours to note on
            member.status = f"failed: {_one_line(error)}"
            print(f"[llm-batch] pool member {member.name}: refused: {error}", file=sys.stderr)
            return
        member.store = OutputStore(config.output.uri, guard=member.lease.check)
        attempt = Attempt(config, member.store, self.started, clock=lambda: self.share(member), share_basis=SHARE_BASIS)
        try:
            attempt.prepare()
        except LeaseLostError:
            raise
        except (
            Exception
        ) as error:  # refused before any work (OutputMismatchError, InputError, ...): noted as a lone job's
            record_failure(member.store, error)
            member.status = f"failed: {_one_line(error)}"
            print(f"[llm-batch] pool member {member.name}: refused: {error}", file=sys.stderr)
            return
        member.attempt = attempt

    def finish(self, member: _Member, stop: Any, completed: bool = True) -> None:
        attempt = member.attempt
        assert attempt is not None
        if attempt.outcome is not None:
            return
        # The engine's timings are the pool's, shared by every member it fed.
        attempt.timings.update({k: v for k, v in self.timings.items() if k != "t0"})
        attempt.memory.update(self.memory)
        outcome = attempt.end(completed, stop)
        self.charged += float(attempt.manifest["attempts"][-1].get("wall_s") or 0.0)
        if outcome.summary is not None:
            member.status = "completed"
        elif outcome.interrupted:
            member.status = "interrupted"
        else:
            member.status = "failed: IncompleteRun: shards never received all their rows"

    def check_leases(self) -> None:
        self.lease.check()
        for member in self.members:
            if member.attempt is not None and member.lease is not None:
                member.lease.check()

    def engine_config(self, running: list[Attempt]) -> JobConfig:
        """The one pipeline's settings: the first member's (every member shares the engine's), with every
        member's uploaded images, so the image stage resolves any member's file ids."""
        images: dict[str, str] = {}
        for attempt in running:
            images.update(attempt.config.input.image_files or {})
        first = running[0].config
        return first.model_copy(update={"input": first.input.model_copy(update={"image_files": images or None})})

    def run(self) -> RunOutcome:
        from workload.job.engine_loop import run_engine
        from workload.runtime import StopSignal, ray_session

        config = self.config
        with contextlib.ExitStack() as held:
            for member in self.members:
                self.open(member, held)
            running = [m for m in self.members if m.attempt is not None]
            with StopSignal(config.resume.grace_period_s) as stop:
                try:
                    completed = True
                    live = [m for m in running if m.attempt is not None and m.attempt.needs_engine]
                    if live and not stop.stopped:
                        feeds = [self._feed(m, stop) for m in live]
                        engine = self.engine_config([m.attempt for m in live if m.attempt is not None])
                        with ray_session(config.device, preload=("workload.engine.pipeline",), stopped=stop.event):
                            completed = run_engine(feeds, engine, stop, self.check_leases, self.timings, self.memory)
                    for member in running:
                        self.finish(member, stop, completed)
                except LeaseLostError:
                    raise
                except Exception as error:  # the engine's failure: every member it left unfinished fails with it
                    for member in running:
                        if member.attempt is not None and member.attempt.outcome is None and member.store is not None:
                            record_failure(member.store, error)
                            member.status = f"failed: {_one_line(error)}"
                    raise
                return self._end(stop)

    def _feed(self, member: _Member, stop: Any) -> Any:
        assert member.attempt is not None
        return member.attempt.feed(finished=lambda: self.finish(member, stop))

    def _end(self, stop: Any) -> RunOutcome:
        if any(m.status == "interrupted" for m in self.members):
            left = sum(
                len(m.attempt.committer.pending) for m in self.members if m.status == "interrupted" and m.attempt
            )
            self.store.write_interrupted(stop.signal_name or "a signal", left)
            return RunOutcome(None, interrupted=True, exit_code=stop.EXIT_CODE)
        summary = {
            "pool": self.spec.pool,
            "members": {m.name: m.status or "failed: not run" for m in self.members},
            "finished_at": utc_now(),
        }
        self.store.write_summary(summary)
        done = sum(1 for m in self.members if m.status == "completed")
        print(f"\nllm-batch pool {self.spec.pool}: {done}/{len(self.members)} members completed", file=sys.stderr)
        for member in self.members:
            print(f"  {member.name}: {member.status}", file=sys.stderr)
        # A member that lost rows between the engine and the driver is a bug, as for a lone job (exit 1).
        incomplete = any((m.status or "").startswith("failed: IncompleteRun") for m in self.members)
        return RunOutcome(summary, interrupted=False, exit_code=1 if incomplete else 0)


def run_pool(config: JobConfig) -> RunOutcome:
    """Run (or resume) every member of the pool `config.input.uri` names, on one engine; the pool's summary is
    written once every member is finished. Raises ConfigError (nothing touched) for a spec that cannot run,
    LeaseHeldError when another process runs this pool; a failure of the pool itself is noted in the pool's
    `_failed.json` (and each unfinished member's)."""
    started = time.monotonic()
    spec = read_spec(config.input.uri, config.output.uri)
    for member in spec.members:
        member_config(config, member)  # every member's config checked before any lease
    with hold_lease(
        OutputStore(config.output.uri).root, config.resume.lease_ttl_s, config.resume.lease_wait_s
    ) as lease:
        store = OutputStore(config.output.uri, guard=lease.check)
        # A new run of the pool: the last run's notes no longer describe it.
        store.clear_notes()
        store.clear_summary()
        try:
            return _Pool(config, spec, store, lease, started).run()
        except LeaseLostError:
            raise
        except Exception as error:
            record_failure(store, error)
            raise
