"""Start-up by phase: marks written by several processes, the breakdown worked out by hand, the ratios."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.workload.test_bench_scorecard import RECORDS, _run
from workload.bench.profiles import get_profile
from workload.bench.report import markdown
from workload.bench.scorecard import build_scorecard
from workload.bench.startup import ENGINE_PHASES, JOB_PHASES, breakdown
from workload.telemetry import startup_trace

REPRO = {
    "command": "python -m workload bench --out x",
    "commit": None,
    "versions": {"python": "3.11"},
    "hardware": {"cpu": "test", "usable_cores": 2, "memory_gib": 1.0},
}


def test_marks_from_several_processes_reach_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "startup.jsonl"
    monkeypatch.setenv(startup_trace.VARIABLE, str(trace))
    startup_trace.mark("ray_start", at=100.0)
    # An actor is another process: it gets the variable through its environment, as pipeline.engine_env passes it.
    code = (
        "from workload.telemetry.startup_trace import mark; "
        "mark('engine_build_start', at=110.0); mark('engine_ready', at=130.0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
    startup_trace.mark("engine_build_start", at=150.0)  # a second replica's, later: the first one counts
    marks = startup_trace.first_marks(startup_trace.read_marks(trace))
    assert marks == {"ray_start": 100.0, "engine_build_start": 110.0, "engine_ready": 130.0}
    assert len({item["pid"] for item in startup_trace.read_marks(trace)}) == 2


def test_no_variable_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(startup_trace.VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    startup_trace.mark("ray_start")
    assert list(tmp_path.iterdir()) == []


def test_job_breakdown_by_hand() -> None:
    marks = {"ray_start": 103.0, "ray_ready": 107.5, "pipeline_built": 110.0, "engine_actor_process_start": 111.0}
    marks.update(engine_build_start=120.0, engine_ready=150.0, first_token=152.0)
    figures = breakdown(JOB_PHASES, 100.0, marks)
    assert figures["total_s"] == 52.0
    assert list(figures["phases_s"].values()) == [3.0, 4.5, 2.5, 1.0, 9.0, 30.0, 2.0]
    assert sum(figures["phases_s"].values()) == figures["total_s"]


def test_a_missing_mark_is_unmeasured_not_zero() -> None:
    figures = breakdown(ENGINE_PHASES, 100.0, {"engine_ready": 140.0, "first_token": 141.0})
    assert figures["phases_s"]["python and imports"] is None
    assert figures["phases_s"]["engine build (engine process, model load, KV cache)"] is None
    assert figures["phases_s"]["first token"] == 1.0 and figures["total_s"] == 41.0
    assert breakdown(ENGINE_PHASES, 100.0, {})["total_s"] is None


def test_scorecard_ratios_for_startup_and_memory() -> None:
    engine_startup = breakdown(
        ENGINE_PHASES, 0.0, {"engine_build_start": 8.0, "engine_ready": 38.0, "first_token": 40.0}
    )
    job_startup = breakdown(
        JOB_PHASES,
        0.0,
        {"ray_start": 8.0, "ray_ready": 12.0, "pipeline_built": 14.0, "engine_actor_process_start": 15.0}
        | {"engine_build_start": 20.0, "engine_ready": 50.0, "first_token": 56.0},
    )
    continuous, job = _run("continuous", RECORDS), _run("job", RECORDS)
    continuous.notes["startup"], job.notes["startup"] = engine_startup, job_startup
    job.peak_memory_bytes = int(continuous.peak_memory_bytes * 1.5)
    scorecard = build_scorecard(get_profile("cpu"), [continuous, job], engine_args={}, reproducibility=REPRO, errors={})
    assert scorecard["job_startup_over_engine_startup"] == pytest.approx(56.0 / 40.0)
    assert scorecard["job_peak_memory_over_engine"] == pytest.approx(1.5)
    # Both are "at most" targets: 1.4 and 1.5 miss 1.3.
    assert scorecard["targets_met"]["job_startup_over_engine_startup"] is False
    assert scorecard["targets_met"]["job_peak_memory_over_engine"] is False
    assert scorecard["startup"]["job"]["phases_s"]["Ray start"] == 4.0
    text = markdown(scorecard)
    assert "job start-up / engine start-up: **1.40**, target <= 1.3 (target missed)" in text
    assert "- job: **56.0 s** (python and imports 8.0, Ray start 4.0" in text


def test_a_run_without_startup_figures_leaves_the_ratio_unmeasured() -> None:
    scorecard = build_scorecard(
        get_profile("cpu"),
        [_run("continuous", RECORDS), _run("job", RECORDS)],
        engine_args={},
        reproducibility=REPRO,
        errors={},
    )
    assert scorecard["job_startup_over_engine_startup"] is None
    assert scorecard["targets_met"]["job_startup_over_engine_startup"] is False
    assert "job start-up / engine start-up: not measured" in markdown(scorecard)
