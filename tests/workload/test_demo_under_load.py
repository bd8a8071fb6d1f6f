"""`make demo` as a new user on a busy 2-core machine runs it: the demo's own config (which sets a sampling seed)
at a terminal, while another process keeps one core busy.

Two promises in one engine start. Under load vLLM chunks prefills, and on the CPU a seeded chunked prefill kills
the engine: the job's engine settings must keep that from ever happening. And at a terminal the newcomer reads the
product's own lines (one redrawn progress bar, the summary with the bad rows by type), while Ray's and vLLM's own
log lines go to the run's log file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.workload.jobrun import run_job_at_a_terminal, terminal_lines

pytestmark = pytest.mark.slow

# The product's own lines, and the summary's indented continuation lines (workload/job/summary.py).
PRODUCT_LINE = re.compile(r"^(\[llm-batch\]|llm-batch:|  (tokens|model|output): )")


def test_demo_config_at_a_terminal_with_a_core_burning(tmp_path: Path) -> None:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        code, screen = run_job_at_a_terminal(
            [
                "run",
                "--config",
                str(REPO_ROOT / "examples" / "demo.yaml"),
                "--input",
                str(REPO_ROOT / "data" / "sample.jsonl"),
                "--output",
                str(tmp_path / "out"),
            ],
            cwd=tmp_path,
            timeout=600,
        )
    finally:
        burner.kill()
        burner.wait()
    logs = sorted((tmp_path / ".runs" / "logs").glob("run-*.log"))
    log = logs[-1].read_text() if logs else ""
    assert code == 0, screen + log
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["engine_restarts"] == 0, log
    # The sample's five deliberately bad rows are the only errors: every valid row is answered.
    assert summary["rows_in"] == 195 and summary["rows_ok"] == 190 and summary["rows_failed"] == 5, summary
    assert "engine_crash" not in summary["errors_by_type"]
    for sign_of_a_death in ("engine died", "EngineDeadError", "CPU Generator does not use offset", "worker died"):
        assert sign_of_a_death not in screen + log

    seen = terminal_lines(screen)
    assert len(seen) <= 30, seen
    assert [line for line in seen if not PRODUCT_LINE.match(line)] == [], "a line that is not the product's"
    assert f"Ray's and vLLM's logs: .runs/logs/{logs[-1].name}" in screen
    assert any("195/195 rows" in line and "|" in line for line in seen), "the progress bar, ending at the total"
    assert any(
        line.startswith("llm-batch: 190/195 rows answered, 5 recorded as errors (duplicate_id 1") for line in seen
    )
    # What went to the file instead: Ray's own start-up line and Ray Data's execution plans.
    assert "Started a local Ray instance" in log and "Execution plan of Dataset" in log
    assert "Started a local Ray instance" not in screen
