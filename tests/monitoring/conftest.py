"""A run published by the real CloudWatch sink to the moto server, for checks that alarms, dashboard and
queries read what the job actually sends."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from workload.contract.config import MetricsConfig
from workload.telemetry.cloudwatch import CloudWatchMetrics
from workload.telemetry.gpu import GpuSampler
from workload.telemetry.metrics import BatchReport

STACK = "mon-test"
GROUP = "/llm-batch/mon-test/job"


class FakeNvml:
    """Stands in for pynvml: this machine has no NVIDIA driver, so no real NVML reading can happen here."""

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=12)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=3, total=4)

    def nvmlShutdown(self) -> None:
        pass


@dataclass
class PublishedRun:
    config: MetricsConfig
    metrics: list[dict[str, Any]]  # list_metrics output
    log_lines: list[dict[str, Any]]


@pytest.fixture
def published_run(moto_reset: str) -> PublishedRun:
    logs = boto3.client("logs", region_name="us-east-1")
    logs.create_log_group(logGroupName=GROUP)
    config = MetricsConfig(
        sink="cloudwatch",
        stack=STACK,
        run_id="r1",
        log_group=GROUP,
        region="us-east-1",
        price_per_hour_usd=1.0,
        publish_interval_s=300,
    )
    sink = CloudWatchMetrics(config, "r1", instance_id="i-0abc", gpu_sampler=GpuSampler(FakeNvml(), [0]))
    for duration in (0.5, 1.5, 90.0):
        sink.batch_complete(BatchReport(duration, rows_ok=31, rows_failed=1, input_tokens=300, output_tokens=900))
    sink.run_complete(
        {
            "rows_in": 96,
            "rows_ok": 93,
            "rows_failed": 3,
            "input_tokens": 900,
            "output_tokens": 2700,
            "wall_s": 100.0,
            "output_tok_per_s": 27.0,
        }
    )
    sink.close()
    # An engine actor's publisher, fed vLLM's own stats objects as its scheduler hands them over each step: an
    # engine that admits more than its KV cache holds (full cache, a queue, preemptions).
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    from workload.telemetry.engine_stats import EngineStats

    stats = EngineStats(max_num_seqs=256)
    step = IterationStats()
    step.num_preempted_reqs = 80
    stats.record(SchedulerStats(num_running_reqs=55, num_waiting_reqs=200, kv_cache_usage=0.97), step)
    CloudWatchMetrics(
        config, "r1", instance_id="i-0abc", gpu_sampler=False, heartbeat=False, engine_stats=stats
    ).close()
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    metrics = cloudwatch.list_metrics(Namespace=config.namespace)["Metrics"]
    stream = logs.describe_log_streams(logGroupName=GROUP)["logStreams"][0]["logStreamName"]
    events = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)["events"]
    return PublishedRun(config, metrics, [json.loads(event["message"]) for event in events])
