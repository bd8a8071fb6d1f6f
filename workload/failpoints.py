"""Named points where a test can kill the whole job, to prove that a kill at that moment loses and doubles nothing.

`LLM_BATCH_FAILPOINT=<name>[:<n>]` SIGKILLs the job's process group (driver, Ray, engine: what a Spot reclaim or
an OOM kill does) the n-th time (default first) the job reaches <name>. Unset, `reached` costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ATTEMPT_STARTED = "attempt_started"  # manifest written, nothing committed, no engine yet
SHARD_PARTS_WRITTEN = "shard_parts_written"  # a shard's files are in _pending/, its marker not yet written
SHARD_COMMITTED = "shard_committed"  # the marker is written, the files not yet moved into results/
SUMMARY_WRITING = "summary_writing"  # every shard committed, summary.json not yet written
POINTS = frozenset({ATTEMPT_STARTED, SHARD_PARTS_WRITTEN, SHARD_COMMITTED, SUMMARY_WRITING})

_hits: Counter[str] = Counter()


def reached(name: str) -> None:
    spec = os.environ.get("LLM_BATCH_FAILPOINT")
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target not in POINTS:
        raise ValueError(f"LLM_BATCH_FAILPOINT names an unknown point {target!r}; known: {sorted(POINTS)}")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        os.killpg(os.getpgrp(), signal.SIGKILL)
