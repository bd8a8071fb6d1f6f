"""SIGTERM at any moment of the job's life is an interruption: exit 143 and `_interrupted.json`, so a cancel or a
node's stop resumes later instead of failing. The moment tested here is the hardest one: inside `ray.init`, where
Ray's own handlers (a Python `sys.exit(15)` and the core worker's C++ failure-signal handler) used to end the job
with 15 or an abort. Real Ray; the job stops before any engine starts, so no vLLM is loaded."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.workload.jobrun import finish, start_job, write_config, write_jsonl
from workload.telemetry.startup_trace import VARIABLE, read_marks

pytestmark = pytest.mark.slow


def _wait_for(trace: Path, event: str, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if any(mark["event"] == event for mark in read_marks(trace)):
            return True
        time.sleep(0.05)
    return False


def test_a_sigterm_during_rays_start_is_an_interruption(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r-{i}", "prompt": f"p {i}"} for i in range(8)])
    out = tmp_path / "out"
    config = write_config(tmp_path / "job.yaml", str(source), str(out), tmp_path / "models")
    trace = tmp_path / "trace.jsonl"
    job = start_job(["run", "--config", str(config)], {VARIABLE: str(trace)})
    assert _wait_for(trace, "ray_start", 120), "the job never reached Ray's start"
    time.sleep(0.5)  # inside ray.init: its GCS and raylet take seconds to come up
    signalled_at = time.time()
    job.send_signal(signal.SIGTERM)  # to the driver alone, as the kubelet and the local executor send it
    code, log = finish(job, timeout=180)
    assert code == 143, log[-3000:]
    ready = [mark["t"] for mark in read_marks(trace) if mark["event"] == "ray_ready"]
    assert not ready or signalled_at < ready[0], "the signal came after Ray had started: not the moment tested"
    note = json.loads((out / "_interrupted.json").read_text())
    assert note["signal"] == "SIGTERM" and note["shards_left"] == 1
    assert not (out / "summary.json").exists()
