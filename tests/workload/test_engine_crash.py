"""A row that kills the engine, with the real engine: the failpoint makes the engine actor raise vLLM's own fatal
error (EngineDeadError) on chosen row ids; Ray, Ray Data LLM, vLLM and the tiny model are real. One engine start per
run; each injected death costs an engine rebuild (about 15 s on 2 cores)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.workload.jobrun import run_job, write_config, write_jsonl

pytestmark = pytest.mark.slow


def _errors(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((out / "errors").glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_poison_row_is_isolated_and_a_crash_tied_to_no_row_fails_the_run(tmp_path: Path) -> None:
    rows = [{"id": f"r-{i:02d}", "prompt": f"Prompt {i} about nightly batches"} for i in range(10)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    config = write_config(tmp_path / "job.yaml", str(source), str(out), tmp_path / "models")

    started = time.monotonic()
    code, log = run_job(
        ["run", "--config", str(config)], env={"LLM_BATCH_FAILPOINT": "engine_crash_on_row:r-05"}, timeout=420
    )
    elapsed = time.monotonic() - started
    assert code == 0, log
    answered = pq.read_table(out / "results").column("id").to_pylist()
    assert sorted(answered) == [r["id"] for r in rows if r["id"] != "r-05"]
    [crash] = _errors(out)
    assert crash["id"] == "r-05" and crash["error_type"] == "engine_crash"
    assert "EngineDeadError" in crash["error_message"] and "failpoint engine_crash_on_row" in crash["error_message"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors_by_type"] == {"engine_crash": 1} and summary["rows_ok"] == 9
    assert elapsed < 400, f"took {elapsed:.0f} s"

    # Both rows of a two-row batch kill the engine on their own: no row can be blamed, so the run fails (no loop).
    pair = write_jsonl(tmp_path / "pair.jsonl", rows[:2])
    failed_out = tmp_path / "failed"
    config = write_config(tmp_path / "pair.yaml", str(pair), str(failed_out), tmp_path / "models", batch_size=2)
    code, log = run_job(
        ["run", "--config", str(config)], env={"LLM_BATCH_FAILPOINT": "engine_crash_on_row:r-00,r-01"}, timeout=300
    )
    assert code != 0, log
    failure = json.loads((failed_out / "_failed.json").read_text())
    assert failure["error_type"] == "EngineCrashLoopError", failure
    assert "tied to no row" in failure["error_message"]
    assert not (failed_out / "summary.json").exists()
