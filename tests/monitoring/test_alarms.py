"""Alarm definitions: they watch what the job publishes, and CloudWatch (moto) accepts them as written."""

from __future__ import annotations

import operator
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from pydantic import ValidationError

from monitoring.alarms import (
    AlarmSpec,
    AlarmThresholds,
    batch_api_alarms,
    billing_alarm,
    evaluation_minutes,
    job_alarms,
)
from tests.monitoring.conftest import STACK, PublishedRun
from workload.contract import metric_names as mn
from workload.contract.config import DEFAULT_METRICS_NAMESPACE, MetricsConfig
from workload.telemetry.cloudwatch import CloudWatchMetrics

THRESHOLDS = AlarmThresholds(
    gpu_util_min_percent=35, gpu_util_low_minutes=20, batch_latency_p95_max_s=60, error_ratio_max=0.02,
    no_progress_minutes=45,
)  # fmt: skip
_COMPARE = {
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
    "GreaterThanThreshold": operator.gt,
}


def _alarms() -> dict[str, AlarmSpec]:
    return {spec.key: spec for spec in job_alarms(STACK, DEFAULT_METRICS_NAMESPACE, THRESHOLDS)}


def test_alarms_take_their_thresholds_from_config() -> None:
    alarms = _alarms()
    assert set(alarms) == {"gpu-underused", "batch-latency", "error-ratio", "no-progress", "engine-preemptions"}
    assert alarms["gpu-underused"].threshold == 35 and evaluation_minutes(alarms["gpu-underused"]) == 20
    assert alarms["batch-latency"].threshold == 60
    assert alarms["error-ratio"].threshold == 0.02
    assert evaluation_minutes(alarms["no-progress"]) == 45
    billing = billing_alarm(1234)
    assert billing.threshold == 1234 and billing.metric is not None
    assert (billing.metric.namespace, billing.metric.name) == ("AWS/Billing", "EstimatedCharges")
    # Defaults are the issue's: GPU under 30 % for 15 minutes, p95 over 120 s.
    defaults = {spec.key: spec for spec in job_alarms(STACK, DEFAULT_METRICS_NAMESPACE, AlarmThresholds())}
    assert defaults["gpu-underused"].threshold == 30 and evaluation_minutes(defaults["gpu-underused"]) == 15
    assert defaults["batch-latency"].threshold == 120


def test_missing_data_is_never_an_alarm_on_job_metrics() -> None:
    """No run tonight means no data: none of the job alarms may fire on it."""
    assert {spec.treat_missing_data for spec in _alarms().values()} == {"notBreaching"}
    assert billing_alarm(1234).treat_missing_data == "ignore"


def test_alarms_watch_exactly_what_the_job_published(published_run: PublishedRun) -> None:
    published = {
        (m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) for m in published_run.metrics
    }
    for spec in _alarms().values():
        for ref in spec.metrics():
            assert ref.namespace == published_run.config.namespace
            assert ref.dimensions == {mn.DIM_STACK: STACK}, spec.key  # Stack only: one alarm for every night
            assert (ref.name, ((mn.DIM_STACK, STACK),)) in published, f"{spec.key} watches unpublished {ref.name}"


def test_thresholds_reject_bad_values_naming_the_key() -> None:
    with pytest.raises(ValidationError, match="gpu_util_low_minutes must be a multiple of 5"):
        AlarmThresholds(gpu_util_low_minutes=17)
    with pytest.raises(ValidationError, match="error_ratio_max"):
        AlarmThresholds(error_ratio_max=1.5)
    with pytest.raises(ValidationError, match="no_progress_minutes"):
        AlarmThresholds(no_progress_minutes=5)
    with pytest.raises(ValidationError, match="gpu_util_low"):
        AlarmThresholds.model_validate({"gpu_util_low": 30})  # a typo


def test_cloudwatch_accepts_every_alarm(moto_reset: str) -> None:
    client = boto3.client("cloudwatch", region_name="us-east-1")
    topic = "arn:aws:sns:us-east-1:123456789012:llm-batch-alerts"
    specs = [*_alarms().values(), billing_alarm(1234), *batch_api_alarms(STACK, DEFAULT_METRICS_NAMESPACE)]
    for spec in specs:
        client.put_metric_alarm(**spec.put_metric_alarm_kwargs(f"{STACK}-{spec.key}", [topic]))
    stored = {alarm["AlarmName"]: alarm for alarm in client.describe_alarms()["MetricAlarms"]}
    assert set(stored) == {f"{STACK}-{spec.key}" for spec in specs}
    ratio = stored[f"{STACK}-error-ratio"]
    assert ratio["Threshold"] == 0.02 and ratio["TreatMissingData"] == "notBreaching"
    assert {query["Id"] for query in ratio["Metrics"]} == {"ok", "failed", "e1"}
    gpu = stored[f"{STACK}-gpu-underused"]
    assert (gpu["MetricName"], gpu["Statistic"], gpu["EvaluationPeriods"]) == ("GPUUtilization", "Average", 4)
    assert gpu["AlarmActions"] == [topic] and "What to do:" in gpu["AlarmDescription"]
    failed = stored[f"{STACK}-batch-api-failed"]
    assert (failed["MetricName"], failed["Statistic"], failed["Threshold"]) == ("BatchApiFailed", "Sum", 0)


def _latest(spec: AlarmSpec) -> list[float]:
    """The values CloudWatch evaluates for a single-metric alarm, read with the alarm's own MetricStat."""
    assert spec.metric is not None
    ref = spec.metric
    now = datetime.now(UTC)
    result = boto3.client("cloudwatch", region_name="us-east-1").get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": ref.namespace,
                        "MetricName": ref.name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in ref.dimensions.items()],
                    },
                    "Period": ref.period_s,
                    "Stat": ref.statistic,
                },
            }
        ],
        StartTime=now - timedelta(minutes=30),
        EndTime=now + timedelta(minutes=5),
    )
    return [float(value) for value in result["MetricDataResults"][0]["Values"]]


def test_no_progress_alarm_sees_a_stuck_run_and_not_an_idle_night(moto_reset: str) -> None:
    spec = _alarms()["no-progress"]
    assert _latest(spec) == []  # idle night: no data, which the alarm treats as not breaching

    config = MetricsConfig(sink="cloudwatch", stack=STACK, region="us-east-1", publish_interval_s=0.2)
    stuck = CloudWatchMetrics(config, "stuck-run", instance_id="i-test", gpu_sampler=False)
    try:
        time.sleep(0.7)  # alive, publishing, but no batch finishes
        values = _latest(spec)
    finally:
        stuck.close()
    assert values and all(_COMPARE[spec.comparison](value, spec.threshold) for value in values)


def test_gpu_and_latency_alarms_breach_on_what_a_bad_run_publishes(published_run: PublishedRun) -> None:
    """The fixture's run: GPUs at 12 % and one 90 s batch among three; an engine preempting 80 sequences."""
    alarms = {spec.key: spec for spec in job_alarms(STACK, published_run.config.namespace, THRESHOLDS)}
    for key in ("gpu-underused", "batch-latency", "engine-preemptions"):
        values = _latest(alarms[key])
        assert values and all(_COMPARE[alarms[key].comparison](v, alarms[key].threshold) for v in values), key


def test_operations_doc_explains_every_alarm() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = readme.split("<!-- section: operations -->", 1)[1].split("\n## ", 1)[0]
    for spec in [*_alarms().values(), billing_alarm(1)]:
        assert f"`{spec.key}`" in section, f"docs/operations.md does not explain {spec.key}"
    assert "account-wide" in section and "us-east-1" in section
