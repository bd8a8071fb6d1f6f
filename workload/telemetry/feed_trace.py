"""Per-step samples of an engine's feed, for tests and the benchmark: set LLM_BATCH_FEED_TRACE to a folder and each
engine actor appends one JSON line per vLLM step to `engine-<pid>.jsonl` there.

A line: `rows_in_flight` (rows the job has handed this engine's stage and not yet had back), `rows_open` (of those,
the rows the stage has asked of the engine and not had back: a batch's answered rows wait for its slowest one, and
are no longer open), vLLM's own `running` and `waiting` after the step, `finished` (requests that ended in the step),
and the engine's settled `max_num_seqs`. The step's busy slots are `running + finished` (engine_stats.finished_in_step
says why).

Open rows the engine core does not hold yet (`rows_open` above `running + waiting + finished`) are in vLLM's frontend,
the Python loop in the stage's process that turns requests into the core's input and every step's outputs into
text: the job handed them over, the frontend had not passed them on. On the CPU with a tiny model (steps of a few
ms) that loop, not the job's feed, is what bounds the fill (docs/benchmark.md, "Proven by counts").

Fed like workload/telemetry/engine_stats.py: appended to the engine's own stat loggers, so vLLM calls `record` with
every step's stats. Off unless the variable is set; a run never pays for it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from workload.telemetry.engine_stats import StepLogger, attach, finished_in_step

VARIABLE = "LLM_BATCH_FEED_TRACE"


class FeedTrace(StepLogger):
    """A vLLM stat logger (the interface StatLoggerManager calls) that writes one line per step."""

    def __init__(self, folder: str, max_num_seqs: int, stage_counts: Callable[[], dict[str, int]]) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(Path(folder) / f"engine-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
        self._lock = threading.Lock()
        self._max_num_seqs = max_num_seqs
        self._stage_counts = stage_counts

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if scheduler_stats is None:
            return
        finished = finished_in_step(iteration_stats)
        sample = {
            "t": time.monotonic(),
            **self._stage_counts(),
            "running": int(scheduler_stats.num_running_reqs),
            "waiting": int(scheduler_stats.num_waiting_reqs),
            "finished": finished,
            "max_num_seqs": self._max_num_seqs,
        }
        with self._lock:
            self._file.write(json.dumps(sample) + "\n")


def attach_trace(async_engine: Any, max_num_seqs: int, stage_counts: Callable[[], dict[str, int]]) -> bool:
    """Trace this engine's steps where LLM_BATCH_FEED_TRACE is set; False where it is not (or vLLM keeps no stats)."""
    folder = os.environ.get(VARIABLE)
    if not folder:
        return False
    return attach(async_engine, FeedTrace(folder, max_num_seqs, stage_counts))


def read_samples(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every engine's samples in a trace folder, by file name, in step order."""
    return {
        path.name: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(folder.glob("engine-*.jsonl"))
    }
