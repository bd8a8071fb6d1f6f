"""The job's CloudWatch sink: metrics (PutMetricData) and structured logs (CloudWatch Logs).

A background thread publishes every `publish_interval_s` while the run lives: the interval's rows, its batch
latency percentiles and (where a GPU exists) its mean GPU utilisation. `run_complete` adds the run's
throughput, duration and cost per million output tokens. Names come from `workload.contract.metric_names`, which the
alarms in `monitoring/` read too. Every AWS call is guarded: a publishing failure logs a warning and the job
goes on.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from workload.contract import metric_names as mn
from workload.contract.config import MetricsConfig
from workload.telemetry.gpu import GpuSample, GpuSampler, mean_sample
from workload.telemetry.log_shipper import LogShipper
from workload.telemetry.metrics import BatchReport

if TYPE_CHECKING:  # engine_stats builds a CloudWatchMetrics for an engine actor: a type here, not an import
    from workload.telemetry.engine_stats import EngineStats

_log = logging.getLogger(__name__)

# PutMetricData takes up to 1,000 metric data points a call; the job sends a few dozen per interval.
_MAX_DATUMS_PER_CALL = 1000
# Short timeouts and one retry: a slow CloudWatch must cost seconds, never the Spot grace period (90 s).
_BOTO_CONFIG = BotoConfig(connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"})
_IMDS = "http://169.254.169.254/latest"

# The only summary keys copied into the run_complete log line: anything else a caller adds (a token, a
# URL with credentials) never reaches the logs.
_SUMMARY_LOG_KEYS = frozenset(mn.LOG_FIELDS[mn.LogEvent.RUN_COMPLETE]) - set(mn.COMMON_LOG_FIELDS)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, not {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cost_per_million_output_tokens(price_per_hour_usd: float, wall_s: float, output_tokens: int) -> float | None:
    """USD per million output tokens of a run, or None where it means nothing (no price or no tokens)."""
    if price_per_hour_usd <= 0 or output_tokens <= 0:
        return None
    return price_per_hour_usd * wall_s / 3600 / output_tokens * 1e6


def log_stream_name(run: str, instance_id: str) -> str:
    """`<run>/<instance>/events`, without the ':' and '*' CloudWatch Logs refuses (a run id is often a time)."""
    name = f"{run}/{instance_id}/events"
    return name.replace(":", "-").replace("*", "-")[:512]


def instance_identity(timeout_s: float = 0.5) -> str:
    """The EC2 instance id (IMDSv2), else the host name (a pod name on EKS, where IMDS is out of reach)."""
    try:
        token_request = urllib.request.Request(
            f"{_IMDS}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        )
        with urllib.request.urlopen(token_request, timeout=timeout_s) as response:
            token = response.read().decode()
        id_request = urllib.request.Request(
            f"{_IMDS}/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(id_request, timeout=timeout_s) as response:
            return str(response.read().decode())
    except OSError:
        return socket.gethostname()


class CloudWatchMetrics:
    """`RunMetrics` that publishes to CloudWatch; see the module docstring."""

    def __init__(
        self,
        config: MetricsConfig,
        run_id: str,
        *,
        instance_id: str | None = None,
        gpu_sampler: GpuSampler | bool | None = True,
        heartbeat: bool = True,
        engine_stats: EngineStats | None = None,
    ) -> None:
        """`gpu_sampler`: True opens NVML where it exists, False never samples, or a sampler to use.

        `heartbeat`: publish the row counts every interval (the driver); False for a process that only
        reports its node's GPUs (`workload.telemetry.gpu_reporter`), which must not look like a run making no progress.
        """
        self._config = config
        self._stack = config.stack
        self._run = config.run_id or run_id
        self._instance_id = instance_id or instance_identity()
        session = boto3.session.Session(region_name=config.region)
        self._cloudwatch = session.client("cloudwatch", config=_BOTO_CONFIG)
        self._shipper: LogShipper | None = None
        if config.log_group:
            # Its own stream: the container log driver writes stdout to `<date>/<instance>` in the same group.
            stream = log_stream_name(self._run, self._instance_id)
            self._shipper = LogShipper(session.client("logs", config=_BOTO_CONFIG), config.log_group, stream)
        if gpu_sampler is True:
            self._gpu: GpuSampler | None = GpuSampler.open()
        else:
            self._gpu = gpu_sampler or None

        self._lock = threading.Lock()  # guards the buffers below
        self._publish_lock = threading.Lock()  # one publication at a time (thread vs run_complete/close)
        self._window: list[BatchReport] = []
        self._rejected = 0  # rows refused by validation since the last publication
        self._gpu_window: list[GpuSample] = []
        self._durations: list[float] = []
        self._heartbeat = heartbeat
        self._engine_stats = engine_stats  # an engine actor's vLLM scheduler statistics
        self._closed = False
        self._finished = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cloudwatch-metrics", daemon=True)
        self._thread.start()

    # RunMetrics -------------------------------------------------------------------------------------

    def batch_complete(self, batch: BatchReport) -> None:
        with self._lock:
            self._window.append(batch)
            self._durations.append(batch.duration_s)
        if self._shipper is not None:
            self._shipper.emit(
                self._line(
                    mn.LogEvent.BATCH_COMPLETE,
                    duration_ms=round(batch.duration_s * 1000, 1),
                    rows=batch.rows_ok + batch.rows_failed,
                    rows_ok=batch.rows_ok,
                    rows_failed=batch.rows_failed,
                    input_tokens=batch.input_tokens,
                    output_tokens=batch.output_tokens,
                    total_tokens=batch.input_tokens + batch.output_tokens,
                )
            )

    def rows_rejected(self, count: int) -> None:
        with self._lock:
            self._rejected += count

    def run_complete(self, summary: dict[str, Any]) -> None:
        """Publish the last interval and the run's totals; the run has ended, so the heartbeat stops."""
        self._finished = True
        self._stop_thread()
        self._publish_interval()
        wall_s = float(summary.get("wall_s", 0.0))
        output_tokens = int(summary.get("output_tokens", 0))
        cost = cost_per_million_output_tokens(self._config.price_per_hour_usd, wall_s, output_tokens)
        datums = self._datums(mn.RUN_DURATION, wall_s)
        if "output_tok_per_s" in summary:
            datums += self._datums(mn.OUTPUT_TOKENS_PER_SECOND, float(summary["output_tok_per_s"]))
        if cost is not None:
            datums += self._datums(mn.COST_PER_MILLION_OUTPUT_TOKENS, cost)
        self._put(datums)
        if self._shipper is not None:
            with self._lock:
                durations = list(self._durations)
            fields = {key: value for key, value in summary.items() if key in _SUMMARY_LOG_KEYS}
            fields["batches"] = len(durations)
            if durations:
                fields["batch_latency_p50_s"] = round(percentile(durations, 50), 3)
                fields["batch_latency_p95_s"] = round(percentile(durations, 95), 3)
            if cost is not None:
                fields["cost_per_million_output_tokens_usd"] = round(cost, 4)
            self._shipper.emit(self._line(mn.LogEvent.RUN_COMPLETE, **fields))
            self._shipper.flush()

    def close(self) -> None:
        """Publish what is left and stop; safe to call twice, and after `run_complete`."""
        if self._closed:
            return
        self._closed = True
        self._stop_thread()
        if not self._finished:  # after run_complete another zero heartbeat would only mislead
            self._publish_interval()
        if self._gpu is not None:
            self._gpu.close()

    # Internals --------------------------------------------------------------------------------------

    def _stop_thread(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        interval = self._config.publish_interval_s
        tick = min(interval, self._config.gpu_sample_interval_s) if self._gpu is not None else interval
        next_publish = time.monotonic() + interval
        # The first sample and heartbeat go out at once, so a run that hangs in start-up is seen too.
        self._sample_gpu()
        self._publish_interval()
        while not self._stop.wait(tick):
            self._sample_gpu()
            if time.monotonic() >= next_publish:
                next_publish += interval
                self._publish_interval()

    def _sample_gpu(self) -> None:
        if self._gpu is None:
            return
        sample = self._gpu.sample()
        if sample is not None:
            with self._lock:
                self._gpu_window.append(sample)

    def _publish_interval(self) -> None:
        """One interval's metrics; RowsProcessed goes out even at 0, as the no-progress heartbeat."""
        with self._publish_lock:
            with self._lock:
                batches, self._window = self._window, []
                rejected, self._rejected = self._rejected, 0
                gpu = mean_sample(self._gpu_window)
                self._gpu_window = []
            datums: list[dict[str, Any]] = []
            if self._heartbeat or batches or rejected:
                rows_ok = sum(batch.rows_ok for batch in batches)
                rows_failed = rejected + sum(batch.rows_failed for batch in batches)
                datums += self._datums(mn.ROWS_PROCESSED, rows_ok + rows_failed)
                datums += self._datums(mn.ROWS_OK, rows_ok) + self._datums(mn.ROWS_FAILED, rows_failed)
            if batches:
                durations = [batch.duration_s for batch in batches]
                datums += self._datums(mn.BATCH_LATENCY_P50, percentile(durations, 50))
                datums += self._datums(mn.BATCH_LATENCY_P95, percentile(durations, 95))
            if gpu is not None:
                datums += self._datums(mn.GPU_UTILIZATION, gpu.util_pct)
                if self._shipper is not None:
                    self._shipper.emit(
                        self._line(
                            mn.LogEvent.GPU_SAMPLE,
                            gpu_count=gpu.gpu_count,
                            gpu_util_pct=round(gpu.util_pct, 1),
                            gpu_mem_used_pct=round(gpu.mem_used_pct, 1),
                        )
                    )
            engine = self._engine_stats.take() if self._engine_stats is not None else None
            if engine is not None:
                datums += self._datums(mn.KV_CACHE_USAGE, 100 * engine.kv_cache_usage_max)
                datums += self._datums(mn.ENGINE_PREEMPTIONS, engine.preemptions)
                datums += self._datums(mn.ENGINE_RUNNING, engine.running_requests)
                datums += self._datums(mn.ENGINE_WAITING, engine.waiting_requests)
                datums += self._datums(mn.ENGINE_FREE_SLOTS, engine.free_slots_mean)
            self._put(datums)
            if self._shipper is not None:
                self._shipper.flush()

    def _datums(self, metric: mn.MetricName, value: float) -> list[dict[str, Any]]:
        values = {mn.DIM_STACK: self._stack, mn.DIM_RUN: self._run}
        now = datetime.now(UTC)
        return [
            {
                "MetricName": metric.name,
                "Dimensions": [{"Name": name, "Value": values[name]} for name in dimension_set],
                "Timestamp": now,
                "Value": float(value),
                "Unit": metric.unit,
            }
            for dimension_set in metric.dimension_sets()
        ]

    def _put(self, datums: list[dict[str, Any]]) -> None:
        for start in range(0, len(datums), _MAX_DATUMS_PER_CALL):
            chunk = datums[start : start + _MAX_DATUMS_PER_CALL]
            try:
                self._cloudwatch.put_metric_data(Namespace=self._config.namespace, MetricData=chunk)
            except (BotoCoreError, ClientError) as error:
                _log.warning("could not publish %d metric values to CloudWatch: %s", len(chunk), error)

    def _line(self, event: str, **fields: Any) -> dict[str, Any]:
        return {
            "event": event,
            "stack": self._stack,
            "run": self._run,
            "instance_id": self._instance_id,
            **fields,
        }
