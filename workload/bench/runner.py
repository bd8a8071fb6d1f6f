"""Run a profile end to end: one worker process per group of modes, then the scorecard, table and plots."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload.bench.engine_args import engine_kwargs
from workload.bench.isolation import worker_env
from workload.bench.plots import plot_latency, plot_throughput
from workload.bench.profiles import BenchProfile, materialise_model
from workload.bench.progress import say
from workload.bench.report import markdown, terminal_summary
from workload.bench.repro import command_line, git_commit, hardware, versions
from workload.bench.results import ModeRun
from workload.bench.scorecard import build_scorecard
from workload.bench.worker import WorkerTask
from workload.telemetry import startup_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
# engine_job_layout: the bare engine again, in the job's engines' process layout (`job_layout_env`), on the bimodal
# point only: the like-for-like baseline the job's start-up and memory ratios are judged on.
GROUPS = ("engine", "engine_job_layout", "job")


def job_layout_env(profile: BenchProfile) -> dict[str, str]:
    """What puts a bare vLLM engine in the job's engine actors' layout: on the CPU, vLLM's engine core runs the
    model in one process (workload/engine/pipeline.py CPU_ONE_PROCESS_ENGINE); on a GPU, vLLM's default layout is
    the job's already."""
    from workload.engine.pipeline import CPU_ONE_PROCESS_ENGINE

    return dict(CPU_ONE_PROCESS_ENGINE) if profile.device == "cpu" else {}


@dataclass(frozen=True)
class BenchOutputs:
    scorecard: dict[str, Any]
    scorecard_json: Path
    table_md: Path
    plots: list[Path]


def _run_group(group: str, task: WorkerTask, out: Path, scratch: Path, profile: BenchProfile) -> list[ModeRun]:
    task_file = out / "raw" / f"{group}-task.json"
    result_file = out / "raw" / f"{group}.json"
    task_file.write_text(task.model_dump_json(indent=2))
    result_file.unlink(missing_ok=True)
    trace_file = out / "raw" / f"{group}-startup.jsonl"
    trace_file.unlink(missing_ok=True)
    say(f"{group} modes: worker starting")
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "workload.bench.worker", str(task_file), str(result_file)],
        env={
            **worker_env(scratch / group, profile.engine),
            **(job_layout_env(profile) if group == "engine_job_layout" else {}),
            startup_trace.VARIABLE: str(trace_file.resolve()),
        },
        cwd=REPO_ROOT,
        check=False,
    )
    if completed.returncode != 0 or not result_file.is_file():
        raise RuntimeError(f"the {group} worker exited with status {completed.returncode}; its log is above")
    say(f"{group} modes: worker done in {time.monotonic() - started:.0f}s")
    return [ModeRun.from_json(item) for item in json.loads(result_file.read_text())]


def run_bench(profile: BenchProfile, out: Path, model_cache: Path, groups: tuple[str, ...] = GROUPS) -> BenchOutputs:
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw").mkdir(exist_ok=True)
    reproducibility = {
        "command": command_line(),
        "commit": git_commit(REPO_ROOT),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions(),
        "hardware": hardware(profile.device),
        "profile": profile.model_dump(mode="json"),
    }
    say(f"profile {profile.name}: {len(profile.points())} points x 3 modes; preparing the model")
    model_path = str(materialise_model(profile.model, model_cache.expanduser()))
    # Ray's socket paths must stay short, so the scratch folder lives in the system temp dir, not under `out`.
    scratch = Path(tempfile.mkdtemp(prefix="llmb-"))
    runs: list[ModeRun] = []
    errors: dict[str, str] = {}
    try:
        for group in groups:
            task = WorkerTask(
                group=group,
                profile=profile,
                model_path=model_path,
                run_dir=str(out / "job-run"),
                points=[p for p in profile.points() if p[0] == "bimodal"]
                if group == "engine_job_layout"
                else profile.points(),
            )
            try:
                runs += _run_group(group, task, out, scratch, profile)
            except RuntimeError as error:
                errors[group] = str(error)
                say(f"{group} modes FAILED: {error}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    config = profile.job_config(model_path, out / "job-run")
    scorecard = without_nan(
        build_scorecard(
            profile,
            runs,
            engine_args=engine_kwargs(config, model_path),
            reproducibility=reproducibility,
            errors=errors,
        )
    )
    scorecard_json = out / "scorecard.json"
    scorecard_json.write_text(json.dumps(scorecard, indent=2, allow_nan=False))
    table_md = out / "scorecard.md"
    table_md.write_text(markdown(scorecard))
    plots = [plot_throughput(scorecard, out / "throughput_vs_decode_length.png")]
    plots.append(plot_latency(runs, "bimodal", out / "latency_bimodal.png"))
    say("done:\n" + terminal_summary(scorecard))
    return BenchOutputs(scorecard, scorecard_json, table_md, plots)


def without_nan(value: Any) -> Any:
    """NaN (a figure that could not be computed, e.g. a window of one request) as JSON null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value
