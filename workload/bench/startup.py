"""Start-up broken down by phase, from the worker process's start to its first output token.

Both groups are timed the same way: the worker is a fresh process (its start is the operating system's record of
it), the phases end at marks the product code writes (workload/telemetry/startup_trace.py), and the first token is
vLLM's
own first-token timestamp of the earliest request. The engine group's first token is its warm-up request's; the
job's is its first point's first request's, with Ray, the dataset's actors and the engine started on the way.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from workload.bench.records import RequestRecord

# Phase name, the mark that ends it; each phase starts where the one before ended.
ENGINE_PHASES = (
    ("python and imports", "engine_build_start"),
    ("engine build (engine process, model load, KV cache)", "engine_ready"),
    ("first token", "first_token"),
)
JOB_PHASES = (
    ("python and imports", "ray_start"),
    ("Ray start", "ray_ready"),
    ("pipeline build (Ray Data LLM's processor)", "pipeline_built"),
    ("engine actor placement (to its process start)", "engine_actor_process_start"),
    ("engine actor imports (vLLM)", "engine_build_start"),
    ("engine build (engine process, model load, KV cache)", "engine_ready"),
    ("first token", "first_token"),
)


def process_start_time() -> float:
    return psutil.Process().create_time()


def first_token_wall(records: list[RequestRecord]) -> float | None:
    """The earliest first token of the records, on the wall clock (records keep CLOCK_MONOTONIC, system-wide)."""
    firsts = [record.first_token for record in records if not record.error and record.first_token > 0]
    if not firsts:
        return None
    return min(firsts) + (time.time() - time.monotonic())


def breakdown(phases: tuple[tuple[str, str], ...], process_start: float, marks: dict[str, float]) -> dict[str, Any]:
    """Seconds per phase and in all; a missing mark leaves its phase unmeasured (None) and the total too."""
    seconds: dict[str, float | None] = {}
    previous: float | None = process_start
    for name, end_mark in phases:
        end = marks.get(end_mark)
        seconds[name] = None if end is None or previous is None else round(end - previous, 2)
        previous = end
    first_token = marks.get(phases[-1][1])
    total = None if first_token is None else round(first_token - process_start, 2)
    return {"total_s": total, "phases_s": seconds, "from": "worker process start", "to": "first output token"}
