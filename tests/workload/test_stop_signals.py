"""SIGTERM at any moment of the job's life is an interruption: exit 143 and `_interrupted.json`, so a cancel or a
node's stop resumes later instead of failing. The moment tested here is the hardest one: inside `ray.init`, where
Ray's own handlers (a Python `sys.exit(15)` and the core worker's C++ failure-signal handler) used to end the job
with 15 or an abort. The stop is the local Batch API's executor's, called as its tick calls it (again on every
pass), which must signal once only, and it comes from a restarted server, which must adopt the job a killed server
left running rather than race it. Real Ray and the real job; it stops before any engine starts, so no vLLM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workload.jobrun import ENGINE
from workload.batch_api import executor as executor_module
from workload.batch_api.executor import CHAT_URL, BatchRun, LocalJobExecutor
from workload.telemetry.startup_trace import VARIABLE, read_marks

pytestmark = pytest.mark.slow


def _wait_for(trace: Path, event: str, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if any(mark["event"] == event for mark in read_marks(trace)):
            return True
        time.sleep(0.05)
    return False


def _chat_line(custom_id: str) -> str:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": body}) + "\n"


def test_a_restarted_server_adopts_the_job_and_stops_it_once_during_rays_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(_chat_line(f"r-{i}") for i in range(8)))
    out = tmp_path / "out"
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(VARIABLE, str(trace))  # the job inherits the environment: its startup marks land here
    started: list[subprocess.Popen[Any]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:  # the real call, its process kept
        started.append(popen(*args, **kwargs))
        return started[-1]

    signalled: list[tuple[int, int]] = []
    kill = os.kill

    def counted(pid: int, number: int) -> None:  # the real call, counted
        signalled.append((pid, number))
        kill(pid, number)

    monkeypatch.setattr(executor_module.subprocess, "Popen", recorded)
    monkeypatch.setattr(executor_module.os, "kill", counted)
    base = {"model": {"cache_dir": str(tmp_path / "models")}, "engine": ENGINE, "sampling": {"max_tokens": 4}}
    first = LocalJobExecutor(base, tmp_path / "runs")
    first.start(BatchRun("batch_stop", str(source), str(out), CHAT_URL))
    log_file = tmp_path / "runs/batch_stop/job.log"
    assert _wait_for(trace, "ray_start", 120), log_file.read_text()[-3000:]
    time.sleep(0.5)  # inside ray.init: its GCS and raylet take seconds to come up
    # The server is killed and restarted: the job runs on in its own session; the new server must adopt it
    # (not `absent`, which would relaunch an attempt every tick while the old one holds the lease).
    restarted = LocalJobExecutor(base, tmp_path / "runs")
    assert restarted.state("batch_stop").name == "running"
    signalled_at = time.time()
    restarted.stop("batch_stop")
    deadline = time.monotonic() + 180
    state = restarted.state("batch_stop")
    while state.name == "running" and time.monotonic() < deadline:
        restarted.stop("batch_stop")  # the tick's next passes: no second signal
        time.sleep(0.5)
        state = restarted.state("batch_stop")
    log = log_file.read_text()
    assert state.name == "stopped", (state, log[-3000:])
    job = started[0]
    assert signalled == [(job.pid, signal.SIGTERM)], log[-3000:]
    assert job.wait(30) == 143, log[-3000:]
    ready = [mark["t"] for mark in read_marks(trace) if mark["event"] == "ray_ready"]
    assert not ready or signalled_at < ready[0], "the signal came after Ray had started: not the moment tested"
    note = json.loads((out / "_interrupted.json").read_text())
    # Stopped before the id pass counted the input (issue 50: the plan no longer counts): the whole input is left.
    assert note["signal"] == "SIGTERM" and note["shards_left"] is None
    assert not (out / "summary.json").exists()
