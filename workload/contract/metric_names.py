"""Every metric, dimension and log field name the job publishes, in one place.

The publisher (`workload.telemetry.cloudwatch`) and the alarms, dashboard and saved queries (`monitoring/`) both import
these names, so an alarm can never watch a metric the job stopped publishing. Pure data: no AWS, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DIM_STACK = "Stack"
DIM_RUN = "Run"

# CloudWatch evaluates the job's alarms over periods of this length. The job publishes at least once per
# period while it runs (the config caps its publish interval here), so a running job never leaves a gap
# that an alarm would read as "no run".
ALARM_PERIOD_S = 300


class Scope(Enum):
    """Which dimension sets a metric carries."""

    STACK = "stack"  # alarm-facing: `Stack` only, so one alarm covers every night's run
    RUN = "run"  # per-run detail: `Stack` and `Run`
    BOTH = "both"


@dataclass(frozen=True)
class MetricName:
    name: str
    unit: str
    scope: Scope
    meaning: str

    def dimension_sets(self) -> list[tuple[str, ...]]:
        sets: list[tuple[str, ...]] = []
        if self.scope in (Scope.STACK, Scope.BOTH):
            sets.append((DIM_STACK,))
        if self.scope in (Scope.RUN, Scope.BOTH):
            sets.append((DIM_STACK, DIM_RUN))
        return sets


# Published every interval while the run works (over the batches finished in that interval).
BATCH_LATENCY_P50 = MetricName(
    "BatchLatencyP50", "Seconds", Scope.BOTH, "median engine time of the batches finished in the interval"
)
BATCH_LATENCY_P95 = MetricName(
    "BatchLatencyP95", "Seconds", Scope.BOTH, "95th percentile engine time of the interval's batches"
)
ROWS_OK = MetricName("RowsOk", "Count", Scope.BOTH, "rows answered in the interval")
ROWS_FAILED = MetricName("RowsFailed", "Count", Scope.BOTH, "rows that failed in the interval")
# Published every interval, 0 included, from the run's start to its end: present = a run is alive,
# 0 = it made no progress. An idle night publishes nothing, which the no-progress alarm treats as fine.
ROWS_PROCESSED = MetricName(
    "RowsProcessed", "Count", Scope.STACK, "rows finished (ok + failed) in the interval; 0 while stuck"
)
GPU_UTILIZATION = MetricName(
    "GPUUtilization", "Percent", Scope.BOTH, "mean NVML utilisation over the node's GPUs in the interval"
)

# Published every interval by each engine actor (not the driver) from vLLM's scheduler
# (workload/telemetry/engine_stats.py).
KV_CACHE_USAGE = MetricName(
    "EngineKVCacheUsage", "Percent", Scope.STACK, "the fullest an engine's KV cache was in the interval"
)
ENGINE_PREEMPTIONS = MetricName(
    "EnginePreemptions", "Count", Scope.STACK, "sequences an engine preempted (to recompute) in the interval"
)
ENGINE_RUNNING = MetricName("EngineRunningRequests", "Count", Scope.STACK, "requests an engine was decoding")
ENGINE_WAITING = MetricName("EngineWaitingRequests", "Count", Scope.STACK, "requests waiting for a place")
# max_num_seqs less running, averaged over the interval's time (an idle engine's slots all free): with rows still to
# process, an engine the job starves (docs/benchmark.md: the feed); monitoring/dashboard.py charts it while the run
# has rows.
ENGINE_FREE_SLOTS = MetricName(
    "EngineFreeSlots", "Count", Scope.STACK, "sequence slots an engine left empty, mean over the interval's time"
)
ENGINE_METRICS = (KV_CACHE_USAGE, ENGINE_PREEMPTIONS, ENGINE_RUNNING, ENGINE_WAITING, ENGINE_FREE_SLOTS)

# Published once, when the run ends.
OUTPUT_TOKENS_PER_SECOND = MetricName(
    "OutputTokensPerSecond", "Count/Second", Scope.BOTH, "the run's output tokens over its wall time"
)
RUN_DURATION = MetricName("RunDuration", "Seconds", Scope.BOTH, "the run's wall time")
COST_PER_MILLION_OUTPUT_TOKENS = MetricName(
    "CostPerMillionOutputTokens", "None", Scope.BOTH, "estimated USD per million output tokens of the run"
)

ALL_METRICS = (
    BATCH_LATENCY_P50,
    BATCH_LATENCY_P95,
    ROWS_OK,
    ROWS_FAILED,
    ROWS_PROCESSED,
    GPU_UTILIZATION,
    OUTPUT_TOKENS_PER_SECOND,
    RUN_DURATION,
    COST_PER_MILLION_OUTPUT_TOKENS,
)

# The online endpoint's (the RayService's), published each interval by `workload.telemetry.serve_reporter` beside its
# head.
SERVE_REQUESTS = MetricName(
    "ServeRequests", "Count", Scope.STACK, "HTTP requests the endpoint answered in the interval"
)
SERVE_ERRORS = MetricName("ServeErrors", "Count", Scope.STACK, "requests answered with a 5xx in the interval")
SERVE_LATENCY_P95 = MetricName(
    "ServeLatencyP95", "Milliseconds", Scope.STACK, "95th percentile end-to-end latency of the interval's requests"
)
SERVE_REPLICAS = MetricName("ServeReplicas", "Count", Scope.STACK, "healthy engine replicas at the interval's end")
SERVE_METRICS = (SERVE_REQUESTS, SERVE_ERRORS, SERVE_LATENCY_P95, SERVE_REPLICAS)

# The Batch API's queue (batch_api.enabled), published by its tick function as Embedded Metric Format lines in
# the function's log (workload/batch_api/queue_metrics.py): the two gauges every tick, the two counts every tick
# and after any request that closed a batch (a batch failed at creation: its file holds no request, or too many).
BATCH_API_QUEUED = MetricName("BatchApiQueued", "Count", Scope.STACK, "batches waiting for their turn (validating)")
BATCH_API_RUNNING = MetricName(
    "BatchApiRunning", "Count", Scope.STACK, "batches a job runs or is stopping for (in_progress/finalizing/cancelling)"
)
BATCH_API_FAILED = MetricName("BatchApiFailed", "Count", Scope.STACK, "batches that became failed since the last line")
BATCH_API_EXPIRED = MetricName(
    "BatchApiExpired", "Count", Scope.STACK, "batches that became expired (24 h window over) since the last line"
)
# Open batches that the measured throughput would not finish inside their window (workload/batch_api/at_risk.py).
BATCH_API_AT_RISK = MetricName(
    "BatchApiAtRisk", "Count", Scope.STACK, "open batches that would not finish in their window at the measured rate"
)
BATCH_API_METRICS = (BATCH_API_QUEUED, BATCH_API_RUNNING, BATCH_API_FAILED, BATCH_API_EXPIRED, BATCH_API_AT_RISK)

# The account-wide billing metric (AWS publishes it, in us-east-1 only).
BILLING_NAMESPACE = "AWS/Billing"
BILLING_METRIC = "EstimatedCharges"
BILLING_DIMENSIONS = {"Currency": "USD"}


class LogEvent:
    """Values of the `event` field of the job's structured log lines."""

    BATCH_COMPLETE = "batch_complete"
    GPU_SAMPLE = "gpu_sample"
    RUN_COMPLETE = "run_complete"


# Fields of the JSON log lines, by event. Saved queries may reference only these (a test checks).
COMMON_LOG_FIELDS = ("event", "stack", "run", "instance_id")
LOG_FIELDS: dict[str, tuple[str, ...]] = {
    LogEvent.BATCH_COMPLETE: (
        *COMMON_LOG_FIELDS,
        "duration_ms",
        "rows",
        "rows_ok",
        "rows_failed",
        "input_tokens",
        "output_tokens",
        "total_tokens",
    ),
    LogEvent.GPU_SAMPLE: (*COMMON_LOG_FIELDS, "gpu_count", "gpu_util_pct", "gpu_mem_used_pct"),
    LogEvent.RUN_COMPLETE: (
        *COMMON_LOG_FIELDS,
        "rows_in",
        "rows_ok",
        "rows_failed",
        "input_tokens",
        "output_tokens",
        "wall_s",
        "output_tok_per_s",
        "started_at",
        "finished_at",
        "model",
        "config_hash",
        "attempts",
        "shards",
        "device",
        "errors_by_type",
        "batches",
        "batch_latency_p50_s",
        "batch_latency_p95_s",
        "cost_per_million_output_tokens_usd",
    ),
}
