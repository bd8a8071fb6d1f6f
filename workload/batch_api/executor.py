"""What runs a batch: the `Executor` interface the service drives, and the local one (`python -m workload run`).

An executor knows nothing of statuses or files: it is told to start (or resume) the job of one batch on its
input and output, to stop it, and is asked how that run stands. The job does the rest: exactly-once resume on
the same output folder, and on SIGTERM a stop that commits what finished and writes partial output.jsonl and
errors.jsonl (workload/job/attempt.py). The scheduler (scheduler.py) is its only caller.

The tiers' executor (sfn_executor.py) starts the same job as a run of their state machine, and more: one
execution there runs several entries of the queue back to back on one GPU boot. What that takes of the
scheduler (start a night, hand a run to the execution that holds the GPUs, count its polls, answer a retried
step the same) is `ExecutionChain`, which an executor returns from `chain()`, or None where every run is one
the scheduler started (here).

`LocalJobExecutor` runs one job at a time as a child process, each in its own process group, so a stop is a
SIGTERM to the job's driver (as the kubelet sends it) and nothing the job started outlives it: one SIGTERM, then
the job's grace period and a margin (`stop_timeout_s`, as a container's stop timeout), then SIGKILL to the group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from workload.contract.config import build_config
from workload.contract.entrypoint import ENTRYPOINT, run_args, stop_timeout_s

RunStateName = Literal["running", "succeeded", "stopped", "busy", "failed", "absent"]
EXIT_STOPPED = 143  # the job's exit after SIGTERM (workload.runtime.StopSignal.EXIT_CODE)
CHAT_URL = "/v1/chat/completions"
EXIT_LEASE_HELD = 4  # another live attempt holds the output (workload/cli/commands.py): try again later
EXIT_LEASE_LOST = 5  # the attempt lost the output's lease mid-run (workload/cli/commands.py)
PID_FILE = "job.pid.json"  # beside job.yaml: the running job's pid, start time and output


@dataclass(frozen=True)
class BatchRun:
    batch_id: str
    input_uri: str
    output_uri: str
    endpoint: str
    # The vision files its lines name, checked at create to be its owner's: file id -> where the job reads it.
    image_files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunState:
    """`absent`: this executor has no run of the batch (never started, or started by a server before a restart);
    `busy`: refused because another attempt still holds the output; `failed`: `reason` says why, in one line."""

    name: RunStateName
    reason: str | None = None


class ExecutionChain(Protocol):
    """An execution that holds the GPUs and takes the queue's next entry itself when its run ends (the tiers'
    state machine, its NextBatch step: docs/batch-api.md "A night's queue on one boot")."""

    def start_night(self, entry_id: str, date: str) -> str | None:
        """Start the night `date` as an execution of its own; its ARN, or None while another holds the GPUs."""
        ...

    def adopt(self, run: BatchRun, execution_arn: str) -> None:
        """`run` is the next one of the running execution `execution_arn`."""
        ...

    def execution_input(self, run: BatchRun) -> dict[str, Any]:
        """What the execution is given to run `run`."""
        ...

    def turn(self, execution_arn: str, run_id: str) -> None:
        """`run_id` (a batch, or a night) is the run the execution is on now."""
        ...

    def spend(self, execution_arn: str, polls: int) -> int:
        """Add the polls of the run that ended; the polls the execution has spent so far."""
        ...

    def answered(self, execution_arn: str, asked: str | None) -> dict[str, Any] | None:
        """The answer already given to the execution's step entered at `asked`, if any (a retried step)."""
        ...

    def remember(self, execution_arn: str, asked: str | None, answer: dict[str, Any]) -> None: ...

    def execution_of(self, run_id: str) -> str | None:
        """The execution started for `run_id` (a night), if any: a start whose reply never came back."""
        ...


class Executor(Protocol):
    def start(self, run: BatchRun) -> None: ...

    def state(self, batch_id: str) -> RunState: ...

    def occupied(self) -> bool:
        """Whether a run this service did not start holds the GPUs and takes the queue itself when it ends
        (the tiers' state machine); the scheduler then starts nothing beside it."""
        ...

    def stop(self, batch_id: str) -> None:
        """Ask the run to stop and commit what finished; returns at once (`state` says when it has)."""
        ...

    def close(self) -> None:
        """The server is going away: stop every run and wait, so the next server resumes them."""
        ...

    def chain(self) -> ExecutionChain | None:
        """Where runs chain inside an execution that holds the GPUs (the tiers'); None: they never do."""
        ...


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process, or a zombie): with the pid it
    names one process even after the pid is reused (the same reading as the job's lease, which this layer may
    not import)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name, in parentheses, may hold spaces
    return None if fields[0] == "Z" else fields[19]


def job_config(base: dict[str, Any], run: BatchRun) -> dict[str, Any]:
    """The job config of one batch: the server's base config with the batch's input, endpoint and output."""
    config = yaml.safe_load(yaml.safe_dump(base)) or {}
    config["input"] = {**config.get("input", {}), "uri": run.input_uri, "format": "openai", "openai_url": run.endpoint}
    # A batch's images are its own `data:` URLs and its own uploads: the server's image prefix is no tenant's, and
    # a key under it would let one caller have the model describe an object it never uploaded; the uploads are
    # exactly the files its create checked, which the job resolves a file_id through and nothing else
    # (docs/batch-api.md, "Images").
    config["input"]["image_prefix"] = None
    config["input"]["image_files"] = dict(run.image_files) or None
    config["output"] = {**config.get("output", {}), "uri": run.output_uri}
    config.setdefault("resume", {})["mode"] = "resume"  # a restarted server resumes; it never starts over
    return config


def check_base_config(base: dict[str, Any]) -> None:
    """Refuse a base config the job would refuse, at the server's start rather than at the first batch."""
    build_config(job_config(base, BatchRun("batch_check", "/nonexistent/input.jsonl", "/nonexistent/out", CHAT_URL)))


class LocalJobExecutor:
    """Each batch's job as `python -m workload run --config RUNS/<batch>/job.yaml`, its log beside the config."""

    def __init__(self, base_config: dict[str, Any], runs_dir: str | Path, grace_s: float | None = None) -> None:
        """`grace_s`: how long a stopped job may take to commit and write its partial files; the job's own
        `resume.grace_period_s` (from the base config) unless given."""
        self.base, self.runs = base_config, Path(runs_dir)
        if grace_s is None:
            probe = BatchRun("batch_check", "/nonexistent/input.jsonl", "/nonexistent/out", CHAT_URL)
            grace_s = build_config(job_config(base_config, probe)).resume.grace_period_s
        self.grace_s = grace_s
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._stopping: dict[str, float] = {}  # batch id -> when its stop's bound runs out (time.monotonic)
        self._lock = threading.Lock()

    def start(self, run: BatchRun) -> None:
        folder = self.runs / run.batch_id
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder / "job.yaml"
        config_path.write_text(yaml.safe_dump(job_config(self.base, run), sort_keys=False))
        with (folder / "job.log").open("ab") as log, self._lock:
            self._children[run.batch_id] = subprocess.Popen(
                [sys.executable, *ENTRYPOINT[1:], *run_args(str(config_path))],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: Ray and the engine go with it, nothing else does
            )
            pid = self._children[run.batch_id].pid
        # Who runs it and where it writes: a server restarted after a crash (kill -9 of its group leaves the job,
        # in a session of its own, running) adopts the job from this instead of racing it with a new attempt.
        record = {"pid": pid, "started": _process_start(pid), "output": run.output_uri}
        (folder / PID_FILE).write_text(json.dumps(record))

    def state(self, batch_id: str) -> RunState:
        with self._lock:
            child = self._children.get(batch_id)
        if child is None:
            return self._orphan_state(batch_id)
        code = child.poll()
        if code is None:
            return RunState("running")
        with self._lock:
            stopping = batch_id in self._stopping
        self._reap(batch_id, child)
        if code == 0:
            return RunState("succeeded")
        if code in (EXIT_STOPPED, -signal.SIGTERM):  # -SIGTERM: it ended after its summary, as our stop landed
            return RunState("stopped")
        if code == -signal.SIGKILL and stopping:  # past its stop's bound: what it committed stays
            return RunState("stopped")
        if code == EXIT_LEASE_HELD:
            return RunState("busy")
        if code == EXIT_LEASE_LOST:
            # Here nobody else writes the output: the lease lapsed (a laptop asleep, a stalled disk). Not a
            # failure of the batch: the next start resumes what was committed (or, being stopped, it has stopped).
            return RunState("stopped") if stopping else RunState("busy", self._reason(batch_id, code))
        return RunState("failed", self._reason(batch_id, code))

    def _orphan(self, batch_id: str) -> dict[str, Any] | None:
        """The job a previous server started for this batch, if it still runs (same pid, same start time)."""
        try:
            record = json.loads((self.runs / batch_id / PID_FILE).read_text())
        except (OSError, ValueError):
            return None
        pid, started = record.get("pid"), record.get("started")
        if not isinstance(pid, int) or started is None or _process_start(pid) != started:
            return None
        return dict(record)

    def _orphan_state(self, batch_id: str) -> RunState:
        """A run this server did not start: `running` while a previous server's job still runs it (adopted: it
        is followed and stopped like our own); once that ends, what its output says; `absent` with no trace."""
        orphan = self._orphan(batch_id)
        if orphan is not None:
            return RunState("running")
        pid_file = self.runs / batch_id / PID_FILE
        try:
            output = Path(json.loads(pid_file.read_text())["output"])
        except (OSError, ValueError, KeyError, TypeError):
            return RunState("absent")
        pid_file.unlink(missing_ok=True)
        with self._lock:
            self._stopping.pop(batch_id, None)
        if (output / "summary.json").is_file():
            return RunState("succeeded")
        if (output / "_interrupted.json").is_file():
            return RunState("stopped")
        return RunState("absent")  # ended without a word (killed): the scheduler resumes it

    def _reap(self, batch_id: str, child: subprocess.Popen[bytes]) -> None:
        # The driver is gone; whatever it left in its group (Ray workers, engine processes) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        with self._lock:
            if self._children.get(batch_id) is child:
                del self._children[batch_id]
                self._stopping.pop(batch_id, None)
                (self.runs / batch_id / PID_FILE).unlink(missing_ok=True)

    def _reason(self, batch_id: str, code: int) -> str:
        """The job's own one-line error (`llm-batch: ...` or `python -m workload: ...`), else its exit code."""
        log = self.runs / batch_id / "job.log"
        lines = log.read_text(errors="replace").splitlines()[-200:] if log.is_file() else []
        said = [line for line in lines if line.startswith(("llm-batch:", "python -m workload:"))]
        return said[-1] if said else f"the job exited with code {code} (log: {log})"

    def occupied(self) -> bool:
        """Never: every job here is one this executor started for a batch, which the scheduler follows."""
        return False

    def chain(self) -> None:
        """None: each job here is its own process, started by the scheduler; no run takes the next itself."""
        return None

    def stop(self, batch_id: str) -> None:
        """One SIGTERM to the driver, then a bounded wait; past the bound, the whole group is killed. The tick
        calls this on every pass, so a second call never signals again: a second SIGTERM a second after the first
        cut the job's own stop short (exit -15, and none of the partial files the first one was writing)."""
        with self._lock:
            child = self._children.get(batch_id)
        if child is not None:
            pid = child.pid
            if child.poll() is not None:
                return
        else:
            orphan = self._orphan(batch_id)  # a previous server's job, adopted
            if orphan is None:
                return
            pid = int(orphan["pid"])
        with self._lock:
            deadline = self._stopping.get(batch_id)
            if deadline is None:
                self._stopping[batch_id] = time.monotonic() + stop_timeout_s(self.grace_s)
        if deadline is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # the driver alone: it stops its own engine after committing
        elif time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session's group: the job's driver leads it

    def close(self) -> None:
        with self._lock:
            children = dict(self._children)
        for batch_id in children:
            self.stop(batch_id)
        for batch_id, child in children.items():
            with self._lock:
                left = self._stopping.get(batch_id, time.monotonic()) - time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, left))
            self._reap(batch_id, child)
