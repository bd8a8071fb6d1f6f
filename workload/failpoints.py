"""Named points where a test can kill the whole job, or the engine, to prove what happens at that moment.

`LLM_BATCH_FAILPOINT=<name>[:<n>]` SIGKILLs the job's process group (driver, Ray, engine: what a Spot reclaim or
an OOM kill does) the n-th time (default first) the job reaches <name>. Unset, `reached` costs one dict lookup.

`LLM_BATCH_FAILPOINT=engine_crash_on_row:<id>[,<id>...]` instead makes the real engine actor raise vLLM's fatal
engine error (EngineDeadError) every time it is handed a row with one of those ids: a poison row. The driver passes
the variable on to the engine actors' environment (`pipeline.engine_env`); the engine and all around it stay real.

`LLM_BATCH_FAILPOINT=engine_hang_on_row:<id>[,<id>...]` hangs the real engine core on such a row the way a mistyped
request once did: the row's request reaches vLLM's engine core with a float `seed`, its input thread dies on the
type check (`msgspec.ValidationError`), and the core process lives on taking no more requests. Nothing in the job
is mocked: the engine guard must notice the stall by itself.
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
ENGINE_HANG_ON_ROW = "engine_hang_on_row"  # not a kill point: a row id the engine core hangs on
_ROW_POINTS = frozenset({ENGINE_CRASH_ON_ROW, ENGINE_HANG_ON_ROW})

_hits: Counter[str] = Counter()


def reached(name: str) -> None:
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target in _ROW_POINTS:
        return
    if target not in POINTS:
        known = sorted(POINTS | _ROW_POINTS)
        raise ValueError(f"{VARIABLE} names an unknown point {target!r}; known: {known}")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _chosen(point: str, row_id: object) -> bool:
    spec = os.environ.get(VARIABLE)
    if not spec or row_id is None:
        return False
    target, _, chosen = spec.partition(":")
    return target == point and str(row_id) in chosen.split(",")


def crashes_engine_on(row_id: object) -> bool:
    """Whether the engine must die on this row (LLM_BATCH_FAILPOINT=engine_crash_on_row:<id>[,<id>...])."""
    return _chosen(ENGINE_CRASH_ON_ROW, row_id)


def hangs_engine_on(row_id: object) -> bool:
    """Whether the engine core must hang on this row (LLM_BATCH_FAILPOINT=engine_hang_on_row:<id>[,<id>...])."""
    return _chosen(ENGINE_HANG_ON_ROW, row_id)
