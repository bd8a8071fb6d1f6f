"""Start-up marks: named wall-clock instants, appended as JSON lines to the file named in LLM_BATCH_STARTUP_TRACE.

The benchmark sets the variable to break start-up down by phase (workload/bench/startup.py); a run without it
writes nothing. Marks come from the driver (Ray start) and from the engine actor (engine build), which is why a
file and not a return value: the actor's process is Ray's, and `pipeline.engine_env` hands it the variable.
Each mark is one short `write` to a file opened for appending, so marks from several processes never interleave.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

VARIABLE = "LLM_BATCH_STARTUP_TRACE"


def mark(event: str, at: float | None = None) -> None:
    """Record `event` now, or at the Unix time `at` (an instant measured elsewhere, e.g. vLLM's first token)."""
    path = os.environ.get(VARIABLE)
    if not path:
        return
    line = json.dumps({"event": event, "t": time.time() if at is None else at, "pid": os.getpid()}) + "\n"
    with open(path, "a", encoding="utf-8") as trace:
        trace.write(line)


def read_marks(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def first_marks(marks: list[dict[str, Any]]) -> dict[str, float]:
    """The earliest instant of each event: with several points or replicas, start-up is the first of each."""
    earliest: dict[str, float] = {}
    for item in marks:
        event, instant = str(item["event"]), float(item["t"])
        earliest[event] = min(instant, earliest.get(event, instant))
    return earliest
