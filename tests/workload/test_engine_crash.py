"""A crash tied to no row, with the real engine: the failpoint makes the engine actor raise vLLM's own fatal error
(EngineDeadError) on both rows of a batch; Ray, Ray Data LLM, vLLM and the tiny model are real. The run must fail
with the reason in _failed.json instead of restarting the engine forever. (A single poison row, isolated and
recorded while every other row is answered, is shown in test_job_e2e's local run, which shares its engine start.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.workload.jobrun import run_job, write_config, write_jsonl

pytestmark = pytest.mark.slow


def test_every_row_of_a_batch_killing_the_engine_fails_the_run_instead_of_looping(tmp_path: Path) -> None:
    rows = [{"id": f"r-{i}", "prompt": f"Prompt {i} about nightly batches"} for i in range(2)]
    source = write_jsonl(tmp_path / "pair.jsonl", rows)
    out = tmp_path / "out"
    # No whole-batch retry: two rows alone are all it takes to blame no row (the retry is exercised in test_job_e2e).
    engine = {"max_model_len": 512, "max_num_seqs": 16, "enforce_eager": True, "cpu_kvcache_space_gib": 1}
    config = write_config(
        tmp_path / "job.yaml",
        str(source),
        str(out),
        tmp_path / "models",
        batch_size=2,
        engine={**engine, "crash_retries": 0},
    )
    code, log = run_job(
        ["run", "--config", str(config)], env={"LLM_BATCH_FAILPOINT": "engine_crash_on_row:r-0,r-1"}, timeout=300
    )
    assert code == 1, log
    failure = json.loads((out / "_failed.json").read_text())
    assert failure["error_type"] == "EngineCrashLoopError", failure
    assert "every row of a batch of 2 killed the engine on its own" in failure["error_message"]
    assert "failpoint engine_crash_on_row" in failure["error_message"]  # the engine's own error, with its cause
    assert not (out / "summary.json").exists() and not (out / "results").exists()
    assert "Traceback" not in failure["error_message"]
