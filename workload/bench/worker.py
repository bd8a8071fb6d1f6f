"""One group of modes in its own process: `python -m workload.bench.worker TASK.json RESULT.json`.

The orchestrator starts one worker for the engine modes and one for the job, so each has its own engine
start-up, memory and clean-up, and a crash in one cannot take the other's figures with it. vLLM starts its
engine in a new process, so everything runs under the `__main__` guard.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from workload.bench.engine_args import engine_kwargs
from workload.bench.generator import WorkloadSpec
from workload.bench.profiles import BenchProfile
from workload.bench.startup import ENGINE_PHASES, JOB_PHASES, breakdown, process_start_time
from workload.engine.model_source import compile_cache_env
from workload.telemetry import startup_trace


class WorkerTask(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    group: Literal["engine", "engine_job_layout", "job"]
    profile: BenchProfile
    model_path: str
    run_dir: str
    points: list[tuple[str, WorkloadSpec]]


def run_task(task: WorkerTask) -> list[dict[str, Any]]:
    process_start = process_start_time()
    config = task.profile.job_config(task.model_path, Path(task.run_dir))
    if task.group in ("engine", "engine_job_layout"):
        from workload.bench.engine_modes import run_engine_modes
        from workload.bench.results import JOB_LAYOUT_MODE

        # The compile caches the job's engine actor uses (workload/engine/guard.py): both start equally warm.
        os.environ.update(compile_cache_env(config.model))
        like_for_like = task.group == "engine_job_layout"  # the runner set the job's layout in this env
        runs = run_engine_modes(
            engine_kwargs(config, task.model_path),
            task.points,
            task.profile.chunk_size,
            task.profile.device,
            modes=("continuous",) if like_for_like else ("continuous", "synchronous"),
        )
        for run in runs if like_for_like else []:
            run.mode = JOB_LAYOUT_MODE
    else:
        from workload.bench.job_mode import run_job_mode

        runs = run_job_mode(config, task.model_path, task.points)
    trace = os.environ.get(startup_trace.VARIABLE)
    if trace:  # the orchestrator asked for the start-up breakdown (workload/bench/startup.py)
        marks = startup_trace.first_marks(startup_trace.read_marks(Path(trace)))
        startup = breakdown(JOB_PHASES if task.group == "job" else ENGINE_PHASES, process_start, marks)
        for run in runs:
            run.notes["startup"] = startup
    return [run.to_json() for run in runs]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m workload.bench.worker TASK.json RESULT.json", file=sys.stderr)
        return 2
    task = WorkerTask.model_validate_json(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run_task(task)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
