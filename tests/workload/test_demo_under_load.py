"""`make demo` as a new user on a busy 2-core machine runs it: the demo's own config (which sets a sampling seed)
while another process keeps one core busy. Under load vLLM chunks prefills, and on the CPU a seeded chunked prefill
kills the engine; the job's engine settings must keep that from ever happening."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.workload.jobrun import run_job

pytestmark = pytest.mark.slow


def test_demo_config_with_a_core_burning_finishes_with_no_engine_death(tmp_path: Path) -> None:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        code, log = run_job(
            [
                "run",
                "--config",
                str(REPO_ROOT / "examples" / "demo.yaml"),
                "--input",
                str(REPO_ROOT / "data" / "sample.jsonl"),
                "--output",
                str(tmp_path / "out"),
            ],
            timeout=600,
        )
    finally:
        burner.kill()
        burner.wait()
    assert code == 0, log
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["engine_restarts"] == 0, log
    # The sample's five deliberately bad rows are the only errors: every valid row is answered.
    assert summary["rows_in"] == 195 and summary["rows_ok"] == 190 and summary["rows_failed"] == 5, summary
    assert "engine_crash" not in summary["errors_by_type"]
    for sign_of_a_death in ("engine died", "EngineDeadError", "CPU Generator does not use offset", "worker died"):
        assert sign_of_a_death not in log
