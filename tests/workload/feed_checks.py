"""Reading an engine's feed trace (workload/telemetry/feed_trace.py): was the engine kept full while rows waited?"""

from __future__ import annotations

from typing import Any


def feed_verdict(samples: list[dict[str, Any]], total_rows: int) -> dict[str, Any]:
    """Counts over one engine's per-step samples, `total_rows` being every row that engine answered.

    A step's busy slots are vLLM's `running` plus the requests that ended in it (vLLM counts running after it drops
    those). Rows wait while rows are left that the step did not run. From the first step that filled every slot on
    (the fill before that is the pipeline starting), a step with rows waiting that ran fewer than
    min(max_num_seqs, rows left) is either
    - `starved`: the job's feed had not asked the engine for enough rows (`rows_open` short of that), what the job's
      feed answers for; or
    - `frontend_bound`: the rows were asked of the engine and sat in vLLM's frontend, the one Python loop that turns
      requests into the core's input and each step's outputs into text (feed_trace.py): vLLM's CPU, not the feed.
    """
    if not samples:
        raise AssertionError("the feed trace has no samples: was LLM_BATCH_FEED_TRACE passed to the engine?")
    seqs = samples[0]["max_num_seqs"]
    done, filled, starved, frontend_bound = 0, False, [], []
    for index, sample in enumerate(samples):
        left = total_rows - done  # before this step's ends
        busy = sample["running"] + sample["finished"]
        filled = filled or busy >= seqs
        wanted = min(seqs, left)
        if filled and left > busy and busy < wanted:
            step = {"step": index, "busy": busy, "left": left, "rows_open": sample["rows_open"]}
            (starved if sample["rows_open"] < wanted else frontend_bound).append(step)
        done += sample["finished"]
    return {
        "max_num_seqs": seqs,
        "max_rows_in_flight": max(sample["rows_in_flight"] for sample in samples),
        "max_busy": max(sample["running"] + sample["finished"] for sample in samples),
        "filled": filled,
        "steps": len(samples),
        "starved": starved,
        "frontend_bound": frontend_bound,
        "answered": done,
    }
