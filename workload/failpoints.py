"""Named points where a test can kill the whole job, or the engine, to prove what happens at that moment.

`LLM_BATCH_FAILPOINT=<name>[:<n>]` SIGKILLs the job's process group (driver, Ray, engine: what a Spot reclaim or
an OOM kill does) the n-th time (default first) the job reaches <name>. Unset, `reached` costs one dict lookup.

`LLM_BATCH_FAILPOINT=engine_crash_on_row:<id>[,<id>...]` instead makes the real engine actor raise vLLM's fatal
engine error (EngineDeadError) every time it is handed a row with one of those ids: a poison row. The driver passes
the variable on to the engine actors' environment (`pipeline.engine_env`); the engine and all around it stay real.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

VARIABLE = "LLM_BATCH_FAILPOINT"
ATTEMPT_STARTED = "attempt_started"  # manifest written, nothing committed, no engine yet
SHARD_PARTS_WRITTEN = "shard_parts_written"  # a shard's files are in _pending/, its marker not yet written
SHARD_COMMITTED = "shard_committed"  # the marker is written, the files not yet moved into results/
SUMMARY_WRITING = "summary_writing"  # every shard committed, summary.json not yet written
POINTS = frozenset({ATTEMPT_STARTED, SHARD_PARTS_WRITTEN, SHARD_COMMITTED, SUMMARY_WRITING})
ENGINE_CRASH_ON_ROW = "engine_crash_on_row"  # not a kill point: a row id the engine dies on

_hits: Counter[str] = Counter()


def reached(name: str) -> None:
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target == ENGINE_CRASH_ON_ROW:
        return
    if target not in POINTS:
        known = sorted(POINTS | {ENGINE_CRASH_ON_ROW})
        raise ValueError(f"{VARIABLE} names an unknown point {target!r}; known: {known}")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        os.killpg(os.getpgrp(), signal.SIGKILL)


def crashes_engine_on(row_id: object) -> bool:
    """Whether the engine must die on this row (LLM_BATCH_FAILPOINT=engine_crash_on_row:<id>[,<id>...])."""
    spec = os.environ.get(VARIABLE)
    if not spec or row_id is None:
        return False
    target, _, chosen = spec.partition(":")
    return target == ENGINE_CRASH_ON_ROW and str(row_id) in chosen.split(",")
