"""Reading an engine's feed trace (workload/telemetry/feed_trace.py): was the engine kept full while rows waited?"""

from __future__ import annotations

from typing import Any


def feed_verdict(samples: list[dict[str, Any]], total_rows: int) -> dict[str, Any]:
    """Counts over one engine's per-step samples, `total_rows` being every row that engine answered.

    A step's busy slots are vLLM's `running` plus the requests that ended in it (vLLM counts running after it drops
    those). Rows wait while rows are left that the step did not run. The engine is kept full when, from the first
    step that filled every slot on, each step with rows waiting ran at least min(max_num_seqs, rows left); the fill
    before that is the pipeline starting, not the feed. `starved` lists the steps that broke it."""
    if not samples:
        raise AssertionError("the feed trace has no samples: was LLM_BATCH_FEED_TRACE passed to the engine?")
    seqs = samples[0]["max_num_seqs"]
    done, filled, starved = 0, False, []
    for index, sample in enumerate(samples):
        left = total_rows - done  # before this step's ends
        busy = sample["running"] + sample["finished"]
        filled = filled or busy >= seqs
        if filled and left > busy and busy < min(seqs, left):
            starved.append({"step": index, "busy": busy, "left": left, "rows_in_flight": sample["rows_in_flight"]})
        done += sample["finished"]
    return {
        "max_num_seqs": seqs,
        "max_rows_in_flight": max(sample["rows_in_flight"] for sample in samples),
        "max_busy": max(sample["running"] + sample["finished"] for sample in samples),
        "filled": filled,
        "starved": starved,
        "answered": done,
    }
