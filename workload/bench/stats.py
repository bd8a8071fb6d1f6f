"""The figures of one (point, mode) run, computed from its request records alone.

Every latency is measured from the same reference in every mode: `ready`, the moment the workload was
offered to a ready engine (engine modes: the first generate call; the job: the first request's arrival at
its engine, i.e. after the job's actors and engine have started). In a batch job every request exists from
the start, so waiting anywhere - for an earlier synchronous chunk, in the job's pipeline, or in vLLM's
waiting queue - is latency.

- queue time: ready -> the engine first scheduled the request
- time to first token (TTFT): ready -> first output token
- end-to-end latency: ready -> last output token
- inter-token latency (ITL): the request's mean gap between output tokens, (last - first) / (tokens - 1);
vLLM keeps no per-token timestamps per request, so the p95 is over requests' mean gaps
- steady-state window: the first finished request to the last; requests/s counts completions after the
  first,
output tokens/s counts the tokens decoded inside the window (each request's tokens spread evenly between its
first and last token). Engine start-up and the ramp to the first completion are reported apart.
- occupancy: the mean number of requests the engine was decoding during the window, over max_num_seqs; low
occupancy means the engine was starved (the diagnostic for the job's feeding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from workload.bench.records import RequestRecord
from workload.bench.results import ModeRun


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def tokens_in_window(record: RequestRecord, start: float, end: float) -> float:
    """The record's output tokens decoded in [start, end], spread evenly over [first_token, last_token]."""
    span = record.last_token - record.first_token
    if span <= 0:
        return float(record.output_tokens) if start <= record.last_token <= end else 0.0
    overlap = max(0.0, min(end, record.last_token) - max(start, record.first_token))
    return record.output_tokens * overlap / span


def mean_running(records: Sequence[RequestRecord], start: float, end: float) -> float:
    """Time-averaged number of requests between scheduling and their last token, over [start, end]."""
    if end <= start:
        return math.nan
    busy = sum(max(0.0, min(end, r.last_token) - max(start, r.scheduled)) for r in records)
    return busy / (end - start)


def ready_time(run: ModeRun) -> float:
    if run.mode == "job":
        arrivals = [record.arrival for record in run.records if not record.error]
        return min(arrivals) if arrivals else run.submitted
    return run.submitted


def summarise(run: ModeRun, max_num_seqs: int) -> dict[str, Any]:
    ok = [record for record in run.records if record.ok]
    ready = ready_time(run)
    summary: dict[str, Any] = {
        "point": run.point,
        "mode": run.mode,
        "requests": len(run.records),
        "completed": len(ok),
        "failures": len(run.records) - len(ok),
        "failure_reasons": sorted({r.error or "wrong output length" for r in run.records if not r.ok})[:5],
        "output_tokens": sum(record.output_tokens for record in ok),
        "prompt_tokens": sum(record.prompt_tokens for record in ok),
        "startup_s": run.startup_s,
        "peak_memory_gib": run.peak_memory_bytes / 2**30,
        "memory_source": run.memory_source,
        **run.notes,
    }
    if not ok:
        return summary
    first_finish = min(record.last_token for record in ok)
    last_finish = max(record.last_token for record in ok)
    window = last_finish - first_finish
    makespan = last_finish - ready
    itl = [(r.last_token - r.first_token) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    summary.update(
        {
            "window_s": window,
            "ramp_s": first_finish - ready,
            "makespan_s": makespan,
            "requests_per_s": (len(ok) - 1) / window if window > 0 else math.nan,
            "output_tokens_per_s": sum(tokens_in_window(r, first_finish, last_finish) for r in ok) / window
            if window > 0
            else math.nan,
            "overall_requests_per_s": len(ok) / makespan if makespan > 0 else math.nan,
            "overall_output_tokens_per_s": summary["output_tokens"] / makespan if makespan > 0 else math.nan,
            "ttft_p50_s": percentile([r.first_token - ready for r in ok], 50),
            "ttft_p95_s": percentile([r.first_token - ready for r in ok], 95),
            "itl_p95_s": percentile(itl, 95),
            "e2e_p50_s": percentile([r.last_token - ready for r in ok], 50),
            "e2e_p95_s": percentile([r.last_token - ready for r in ok], 95),
            "queue_p50_s": percentile([r.scheduled - ready for r in ok], 50),
            "queue_p95_s": percentile([r.scheduled - ready for r in ok], 95),
            "occupancy": mean_running(ok, first_finish, last_finish) / max_num_seqs,
        }
    )
    return summary


# Written into every scorecard, so a reader of the JSON alone knows what each figure means.
DEFINITIONS = {
    "timestamps": "vLLM RequestStateStats per request (engine-core CLOCK_MONOTONIC; arrival moved onto it), "
    "read the same way in every mode",
    "ready": "engine modes: first generate call on a started engine; job: first arrival at an engine",
    "queue": "ready -> first scheduled",
    "ttft": "ready -> first output token",
    "e2e": "ready -> last output token",
    "itl": "per request (last token - first token) / (tokens - 1); p95 over requests",
    "window": "first finished request -> last finished request (steady state; start-up excluded)",
    "requests_per_s": "completions after the first, over the window",
    "output_tokens_per_s": "tokens decoded inside the window (each request's spread evenly over its decode), "
    "over the window",
    "overall": "ready -> last finished request (includes the ramp, excludes start-up)",
    "occupancy": "mean requests in decode during the window / max_num_seqs",
    "peak_memory": "CPU: summed PSS (proportional set size) of the worker's process tree, peak over the point's "
    "run (the job's includes its start-up); GPU: NVML device memory used",
    "startup": "worker process start -> first output token (engine group: its warm-up request; job: its first "
    "point's first request), by phase; phases end at marks the product code writes "
    "(workload/telemetry/startup_trace.py)",
    "cpu_seconds_by_process": "CPU seconds each process role of the worker's tree spent during the run "
    "(start-up included for the job, whose actors start inside the run)",
    "peak_pss_mib_by_process": "CPU only: the PSS (MiB) of each process role at the sample that made the peak",
    "failures": "requests with an error or an output length other than the requested one (ignore_eos)",
}
