"""The local executor's reading of a job's end and its stop's bound. A real child process stands in for the job
here (the job itself is run by test_stop_signals.py and test_batch_api_e2e.py): the cases are an exit code and a
process that ignores SIGTERM, which the real job produces only after minutes of engine work or never."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from workload.batch_api import executor as executor_module
from workload.batch_api.executor import LocalJobExecutor


def _as_job(executor: LocalJobExecutor, batch_id: str, code: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    executor._children[batch_id] = child  # as `start` keeps the job's process
    return child


def test_exit_5_resumes_rather_than_failing_the_batch(tmp_path: Path) -> None:
    executor = LocalJobExecutor({}, tmp_path / "runs")
    (tmp_path / "runs" / "batch_a").mkdir(parents=True)
    (tmp_path / "runs" / "batch_a" / "job.log").write_text("llm-batch: stopped: lease on /out/_lease.json lost\n")
    _as_job(executor, "batch_a", "raise SystemExit(5)").wait()
    state = executor.state("batch_a")
    assert state.name == "busy" and "lease" in (state.reason or "")  # the next tick starts it again: it resumes
    _as_job(executor, "batch_b", "import time; time.sleep(0.5); raise SystemExit(5)")
    executor.stop("batch_b")  # lost while being stopped: stopped, as asked
    time.sleep(1.0)
    assert executor.state("batch_b").name == "stopped"


def test_a_job_that_outlives_its_stops_bound_is_killed_once_and_counts_as_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor_module, "stop_timeout_s", lambda grace_s: 1)  # the job's grace + margin, shortened
    executor = LocalJobExecutor({}, tmp_path / "runs", grace_s=0)
    deaf = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", deaf], start_new_session=True, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    executor._children["batch_c"] = child
    executor.stop("batch_c")  # SIGTERM, ignored
    executor.stop("batch_c")  # within the bound: nothing more
    time.sleep(0.3)
    assert executor.state("batch_c").name == "running"
    time.sleep(1.0)
    executor.stop("batch_c")  # past it: the group is killed
    assert child.wait(5) == -9
    assert executor.state("batch_c").name == "stopped"  # what it committed stays; the batch closes as asked
