"""The CloudWatch sink against a real moto server: metrics and log events are read back over HTTP."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from workload.contract import metric_names as mn
from workload.contract.config import DEFAULT_METRICS_NAMESPACE, MetricsConfig
from workload.telemetry.cloudwatch import CloudWatchMetrics, cost_per_million_output_tokens, log_stream_name, percentile
from workload.telemetry.gpu import GpuSampler
from workload.telemetry.metric_sinks import open_metrics
from workload.telemetry.metrics import BatchReport

STACK = "test-stack"
RUN = "run-0001"
GROUP = "/llm-batch/test-stack/job"
SECRET = "hf_NOT_A_REAL_TOKEN_9f8e7d"

BATCHES = [
    BatchReport(duration_s=d, rows_ok=ok, rows_failed=bad, input_tokens=10 * ok, output_tokens=20 * ok)
    for d, ok, bad in [(1.0, 32, 0), (2.0, 30, 2), (3.0, 32, 0), (4.0, 31, 1), (10.0, 32, 0)]
]
SUMMARY: dict[str, Any] = {
    "rows_in": 160,
    "rows_ok": 157,
    "rows_failed": 3,
    "input_tokens": 1570,
    "output_tokens": 3140,
    "wall_s": 72.0,
    "output_tok_per_s": 3140 / 72.0,
    "started_at": "2026-11-29T02:00:00Z",
    "finished_at": "2026-11-29T02:01:12Z",
    "model": "Qwen/Qwen3-0.6B",
    "config_hash": "abcdef0123456789",
    "hf_token": SECRET,  # a key the sink must never ship
}


def _config(**overrides: Any) -> MetricsConfig:
    values: dict[str, Any] = {
        "sink": "cloudwatch",
        "stack": STACK,
        "run_id": RUN,
        "log_group": GROUP,
        "region": "us-east-1",
        "price_per_hour_usd": 1.212,
        "publish_interval_s": 300,  # the test decides when to publish
    }
    values.update(overrides)
    return MetricsConfig(**values)


def _dims(stack_only: bool) -> list[dict[str, str]]:
    dims = [{"Name": mn.DIM_STACK, "Value": STACK}]
    return dims if stack_only else [*dims, {"Name": mn.DIM_RUN, "Value": RUN}]


def _values(metric: mn.MetricName, stack_only: bool, stat: str = "Sum") -> list[float]:
    client = boto3.client("cloudwatch", region_name="us-east-1")
    now = datetime.now(UTC)
    result = client.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": DEFAULT_METRICS_NAMESPACE,
                        "MetricName": metric.name,
                        "Dimensions": _dims(stack_only),
                    },
                    "Period": 60,
                    "Stat": stat,
                },
            }
        ],
        StartTime=now - timedelta(minutes=10),
        EndTime=now + timedelta(minutes=5),
    )
    return [float(value) for value in result["MetricDataResults"][0]["Values"]]


def _log_lines() -> list[dict[str, Any]]:
    client = boto3.client("logs", region_name="us-east-1")
    streams = client.describe_log_streams(logGroupName=GROUP)["logStreams"]
    lines = []
    for stream in streams:
        events = client.get_log_events(logGroupName=GROUP, logStreamName=stream["logStreamName"], startFromHead=True)[
            "events"
        ]
        lines += [json.loads(event["message"]) for event in events]
    return lines


def _run(metrics: CloudWatchMetrics) -> None:
    for batch in BATCHES:
        metrics.batch_complete(batch)
    metrics.run_complete(SUMMARY)
    metrics.close()


class _FakeNvml:
    """Stands in for pynvml: this machine has no NVIDIA driver, so no real NVML reading can happen here."""

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=[20, 40][handle])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=8, total=16)

    def nvmlShutdown(self) -> None:
        pass


def test_percentile_and_cost() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 10.0], 50) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 10.0], 95) == pytest.approx(8.8)
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    # A g5.xlarge Spot hour at $1.212 for one hour producing 4.2 M tokens: about $0.29 per million.
    assert cost_per_million_output_tokens(1.212, 3600, 4_200_000) == pytest.approx(0.28857, rel=1e-4)
    assert cost_per_million_output_tokens(0.0, 3600, 10) is None
    assert cost_per_million_output_tokens(1.0, 3600, 0) is None


def test_log_stream_name_has_no_characters_aws_refuses() -> None:
    # The job's default run id is its start time.
    assert log_stream_name("2026-11-29T01:00:00Z", "i-0abc") == "2026-11-29T01-00-00Z/i-0abc/events"
    assert ":" not in log_stream_name("a:b*c", "host") and "*" not in log_stream_name("a:b*c", "host")


def test_metrics_and_logs_reach_cloudwatch(moto_reset: str) -> None:
    boto3.client("logs", region_name="us-east-1").create_log_group(logGroupName=GROUP)
    metrics = open_metrics(_config(), run_id="ignored-when-config-names-one")
    assert isinstance(metrics, CloudWatchMetrics)
    metrics_impl: CloudWatchMetrics = metrics
    _run(metrics_impl)

    # Every published metric carries exactly the dimension sets metric_names declares.
    listed = boto3.client("cloudwatch", region_name="us-east-1").list_metrics(Namespace=DEFAULT_METRICS_NAMESPACE)
    seen = {(m["MetricName"], tuple(sorted(d["Name"] for d in m["Dimensions"]))) for m in listed["Metrics"]}
    expected = {
        (metric.name, tuple(sorted(dims)))
        for metric in mn.ALL_METRICS
        if metric is not mn.GPU_UTILIZATION  # no GPU here
        for dims in metric.dimension_sets()
    }
    assert seen == expected

    assert sum(_values(mn.ROWS_OK, stack_only=True)) == 157
    assert sum(_values(mn.ROWS_FAILED, stack_only=False)) == 3
    assert sum(_values(mn.ROWS_PROCESSED, stack_only=True)) == 160
    assert _values(mn.BATCH_LATENCY_P95, stack_only=True, stat="Maximum") == [pytest.approx(8.8)]
    assert _values(mn.BATCH_LATENCY_P50, stack_only=False, stat="Maximum") == [pytest.approx(3.0)]
    assert _values(mn.RUN_DURATION, stack_only=False, stat="Maximum") == [72.0]
    assert _values(mn.OUTPUT_TOKENS_PER_SECOND, stack_only=True, stat="Maximum") == [pytest.approx(3140 / 72)]
    cost = 1.212 * 72 / 3600 / 3140 * 1e6
    assert _values(mn.COST_PER_MILLION_OUTPUT_TOKENS, stack_only=True, stat="Maximum") == [pytest.approx(cost)]

    lines = _log_lines()
    batch_lines = [line for line in lines if line["event"] == mn.LogEvent.BATCH_COMPLETE]
    assert [line["duration_ms"] for line in batch_lines] == [1000.0, 2000.0, 3000.0, 4000.0, 10000.0]
    assert [line["rows"] for line in batch_lines] == [32] * 5
    assert batch_lines[1]["total_tokens"] == 300 + 600
    (run_line,) = [line for line in lines if line["event"] == mn.LogEvent.RUN_COMPLETE]
    assert run_line["rows_ok"] == 157 and run_line["config_hash"] == "abcdef0123456789"
    assert run_line["batches"] == 5 and run_line["batch_latency_p95_s"] == pytest.approx(8.8)
    assert run_line["cost_per_million_output_tokens_usd"] == pytest.approx(cost, abs=1e-4)
    for line in lines:
        assert line["stack"] == STACK and line["run"] == RUN
        assert set(line) <= set(mn.LOG_FIELDS[line["event"]]), line
        assert SECRET not in json.dumps(line)
        assert "testing" not in json.dumps(line)  # the fake AWS credentials


def test_gpu_utilisation_published_where_a_gpu_exists(moto_reset: str) -> None:
    boto3.client("logs", region_name="us-east-1").create_log_group(logGroupName=GROUP)
    sampler = GpuSampler(_FakeNvml(), handles=[0, 1])
    metrics = CloudWatchMetrics(_config(), RUN, instance_id="i-0123456789abcdef0", gpu_sampler=sampler)
    _run(metrics)
    assert set(_values(mn.GPU_UTILIZATION, stack_only=True, stat="Average")) == {30.0}
    assert set(_values(mn.GPU_UTILIZATION, stack_only=False, stat="Average")) == {30.0}
    gpu_lines = [line for line in _log_lines() if line["event"] == mn.LogEvent.GPU_SAMPLE]
    assert gpu_lines and gpu_lines[0]["gpu_util_pct"] == 30.0 and gpu_lines[0]["gpu_count"] == 2
    assert gpu_lines[0]["gpu_mem_used_pct"] == 50.0 and gpu_lines[0]["instance_id"] == "i-0123456789abcdef0"


def test_no_gpu_means_no_sampler() -> None:
    """On this CPU machine the real NVML finds no driver; a machine with one must return a sampler."""
    sampler = GpuSampler.open()
    try:
        import pynvml

        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        has_gpu = False
    assert (sampler is not None) == has_gpu
    if sampler is not None:
        sampler.close()


def test_heartbeat_while_running_and_silence_after(moto_reset: str) -> None:
    """RowsProcessed goes out every interval, 0 included, and stops when the run has completed."""
    metrics = CloudWatchMetrics(
        _config(publish_interval_s=0.2, log_group=None), RUN, instance_id="i-test", gpu_sampler=False
    )
    time.sleep(1.1)
    metrics.run_complete(SUMMARY)
    metrics.close()
    beats = sum(_values(mn.ROWS_PROCESSED, stack_only=True, stat="SampleCount"))
    assert beats >= 4  # the one at start plus one every 0.2 s
    assert sum(_values(mn.ROWS_PROCESSED, stack_only=True)) == 0
    time.sleep(0.5)
    assert sum(_values(mn.ROWS_PROCESSED, stack_only=True, stat="SampleCount")) == beats


def test_publishing_failures_never_crash_the_job(
    moto_reset: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing log group, then an unreachable endpoint: warnings, no exception."""
    caplog.set_level(logging.WARNING)
    metrics = CloudWatchMetrics(_config(log_group="/no/such/group"), RUN, instance_id="i-test", gpu_sampler=False)
    _run(metrics)
    assert any("/no/such/group" in record.getMessage() for record in caplog.records)
    assert sum(_values(mn.ROWS_OK, stack_only=True)) == 157  # metrics still went out

    caplog.clear()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: connection refused
    metrics = CloudWatchMetrics(_config(), RUN, instance_id="i-test", gpu_sampler=False)
    _run(metrics)
    messages = [record.getMessage() for record in caplog.records]
    assert any("could not publish" in message for message in messages)
    assert any("could not create log stream" in message for message in messages)


def test_rows_rejected_by_validation_count_as_failed_without_a_latency(moto_reset: str) -> None:
    metrics = CloudWatchMetrics(_config(log_group=None), RUN)
    metrics.rows_rejected(4)
    metrics.batch_complete(BatchReport(duration_s=2.0, rows_ok=6, rows_failed=1, input_tokens=60, output_tokens=120))
    metrics.run_complete({**SUMMARY, "rows_in": 11, "rows_ok": 6, "rows_failed": 5})
    metrics.close()
    assert sum(_values(mn.ROWS_FAILED, stack_only=True)) == 5  # the error-ratio alarm sees both kinds
    assert sum(_values(mn.ROWS_PROCESSED, stack_only=True)) == 11
    assert _values(mn.BATCH_LATENCY_P95, stack_only=True, stat="Maximum") == [pytest.approx(2.0)]
