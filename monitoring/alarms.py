"""The stack's CloudWatch alarms as data: what each watches, when it fires, what it means, what to do.

Metric and dimension names come from `workload.contract.metric_names`, the module the job publishes with, so an alarm
cannot watch a metric the job does not send. Pulumi (`infra/components/observability.py`) turns each spec
into an `aws.cloudwatch.MetricAlarm`; tests also put them to a moto server through boto3.

Missing data is decided per alarm. The job publishes only while it runs, so "no data" on the job's metrics
means "no run tonight" and must not wake anyone (notBreaching). The billing metric arrives only a few times a
day, so there a gap keeps the last state (ignore).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workload.contract import metric_names as mn

_PERIOD_MINUTES = mn.ALARM_PERIOD_S // 60
# AWS updates EstimatedCharges a few times a day; a 6-hour period always holds one value.
BILLING_PERIOD_S = 6 * 3600


class AlarmThresholds(BaseModel):
    """The job alarms' thresholds; the stack config's `monitoring` section extends this model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_util_min_percent: float = Field(30.0, gt=0, le=100, description="Mean GPU utilisation under this (%)...")
    gpu_util_low_minutes: int = Field(15, ge=_PERIOD_MINUTES, description="...for this many minutes alarms.")
    batch_latency_p95_max_s: float = Field(120.0, gt=0, description="Batch latency p95 over this alarms.")
    error_ratio_max: float = Field(
        0.05, gt=0, le=1, description="Failed / finished rows in a 5-minute period over this alarms (1: never)."
    )
    no_progress_minutes: int = Field(
        30, ge=2 * _PERIOD_MINUTES, description="A live run that finishes no row for this long alarms."
    )
    preemptions_max: int = Field(
        50, ge=0, description="Engine preemptions in a 5-minute period over this (summed over engines)..."
    )
    preemptions_minutes: int = Field(15, ge=_PERIOD_MINUTES, description="...for this many minutes alarms.")

    @model_validator(mode="after")
    def _whole_periods(self) -> AlarmThresholds:
        for key in ("gpu_util_low_minutes", "no_progress_minutes", "preemptions_minutes"):
            if getattr(self, key) % _PERIOD_MINUTES:
                raise ValueError(f"{key} must be a multiple of {_PERIOD_MINUTES} (the alarm period, in minutes)")
        return self


@dataclass(frozen=True)
class MetricRef:
    namespace: str
    name: str
    dimensions: dict[str, str]
    statistic: str
    period_s: int = mn.ALARM_PERIOD_S


@dataclass(frozen=True)
class AlarmSpec:
    key: str  # the alarm's name suffix, e.g. "gpu-underused"
    meaning: str
    action: str
    comparison: str
    threshold: float
    evaluation_periods: int
    treat_missing_data: str
    metric: MetricRef | None = None
    expression: str | None = None  # metric math over `inputs`, instead of `metric`
    inputs: dict[str, MetricRef] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.metric is None) == (self.expression is None):
            raise ValueError(f"alarm {self.key}: give exactly one of metric or expression")

    @property
    def description(self) -> str:
        return f"{self.meaning} What to do: {self.action}"

    def metrics(self) -> list[MetricRef]:
        """Every metric the alarm reads."""
        return [self.metric] if self.metric else list(self.inputs.values())

    def put_metric_alarm_kwargs(self, name: str, actions: list[str]) -> dict[str, Any]:
        """The alarm as boto3's `put_metric_alarm` takes it (Pulumi's args mirror these fields)."""
        kwargs: dict[str, Any] = {
            "AlarmName": name,
            "AlarmDescription": self.description,
            "ComparisonOperator": self.comparison,
            "Threshold": self.threshold,
            "EvaluationPeriods": self.evaluation_periods,
            "DatapointsToAlarm": self.evaluation_periods,
            "TreatMissingData": self.treat_missing_data,
            "ActionsEnabled": True,
            "AlarmActions": actions,
            "OKActions": actions,
        }
        if self.metric is not None:
            kwargs.update(
                Namespace=self.metric.namespace,
                MetricName=self.metric.name,
                Dimensions=[{"Name": k, "Value": v} for k, v in self.metric.dimensions.items()],
                Statistic=self.metric.statistic,
                Period=self.metric.period_s,
            )
        else:
            queries: list[dict[str, Any]] = [
                {
                    "Id": query_id,
                    "ReturnData": False,
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
                for query_id, ref in self.inputs.items()
            ]
            queries.append({"Id": "e1", "Expression": self.expression, "Label": self.key, "ReturnData": True})
            kwargs["Metrics"] = queries
        return kwargs


def _job_metric(namespace: str, stack: str, metric: mn.MetricName, statistic: str) -> MetricRef:
    if (mn.DIM_STACK,) not in metric.dimension_sets():
        raise ValueError(f"{metric.name} is not published with the Stack dimension alone; alarms need that")
    return MetricRef(namespace, metric.name, {mn.DIM_STACK: stack}, statistic)


def job_alarms(stack: str, namespace: str, thresholds: AlarmThresholds) -> list[AlarmSpec]:
    """The alarms on the job's own metrics, for one stack (every night's run shares them)."""
    return [
        AlarmSpec(
            key="gpu-underused",
            meaning=(
                f"Mean GPU utilisation stayed under {thresholds.gpu_util_min_percent:g}% for "
                f"{thresholds.gpu_util_low_minutes} minutes while the job ran: paid GPUs are idling."
            ),
            action=(
                "Run the 'low GPU utilisation by instance' query; if one node is low, its engine is starved "
                "or stuck; if all are, raise batch_size / max_concurrent_batches / replicas, or check the "
                "input read and the CPU stages."
            ),
            comparison="LessThanThreshold",
            threshold=thresholds.gpu_util_min_percent,
            evaluation_periods=thresholds.gpu_util_low_minutes // _PERIOD_MINUTES,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.GPU_UTILIZATION, "Average"),
        ),
        AlarmSpec(
            key="batch-latency",
            meaning=(
                f"Batch latency p95 stayed over {thresholds.batch_latency_p95_max_s:g} s for two periods: "
                "batches take too long in the engine."
            ),
            action=(
                "Run the 'slow batches' query; long prompts or max_tokens, a KV cache too small "
                "(preemptions), or too many concurrent batches per replica are the usual causes."
            ),
            comparison="GreaterThanThreshold",
            threshold=thresholds.batch_latency_p95_max_s,
            evaluation_periods=2,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.BATCH_LATENCY_P95, "Maximum"),
        ),
        AlarmSpec(
            key="error-ratio",
            meaning=(f"More than {thresholds.error_ratio_max:.0%} of the rows finished in a 5-minute period failed."),
            action=(
                "Read errors/ in the run's output (each failed row keeps its error); prompts over "
                "max_model_len and engine crashes are the usual causes. A rerun retries only failed rows."
            ),
            comparison="GreaterThanThreshold",
            threshold=thresholds.error_ratio_max,
            evaluation_periods=1,
            treat_missing_data="notBreaching",
            # No rows finished means no ratio at all, not a ratio of 0 or of 1.
            expression="IF((ok + failed) > 0, failed / (ok + failed))",
            inputs={
                "ok": _job_metric(namespace, stack, mn.ROWS_OK, "Sum"),
                "failed": _job_metric(namespace, stack, mn.ROWS_FAILED, "Sum"),
            },
        ),
        AlarmSpec(
            key="no-progress",
            meaning=(
                f"The job is alive (it keeps publishing) but finished no row for "
                f"{thresholds.no_progress_minutes} minutes."
            ),
            action=(
                "Check the Ray driver's and engine's logs (a hung engine, a lost worker, a node waiting for "
                "Spot capacity); stop the run: a rerun resumes from the committed shards."
            ),
            comparison="LessThanOrEqualToThreshold",
            threshold=0,
            evaluation_periods=thresholds.no_progress_minutes // _PERIOD_MINUTES,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.ROWS_PROCESSED, "Sum"),
        ),
        AlarmSpec(
            key="engine-preemptions",
            meaning=(
                f"The engines preempted more than {thresholds.preemptions_max} sequences a period for "
                f"{thresholds.preemptions_minutes} minutes: they admit more rows than their KV cache holds, and "
                "recompute every preempted one."
            ),
            action=(
                "Check engine.max_num_seqs and engine.row_tokens against the rows' real length (prompt + "
                "max_tokens); leave max_num_seqs at 'auto' or lower it, or run `python -m workload engine-plan` "
                "for the model and GPU (docs/gpu.md)."
            ),
            comparison="GreaterThanThreshold",
            threshold=thresholds.preemptions_max,
            evaluation_periods=thresholds.preemptions_minutes // _PERIOD_MINUTES,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.ENGINE_PREEMPTIONS, "Sum"),
        ),
    ]


@dataclass(frozen=True)
class ServeWatch:
    """What the online endpoint's alarms and dashboard widgets need (the stack's `serve.*`)."""

    latency_p95_max_ms: float
    error_ratio_max: float
    max_replicas: int
    at_max_minutes: int = 15


def serve_alarms(stack: str, namespace: str, watch: ServeWatch) -> list[AlarmSpec]:
    """The alarms on the endpoint's metrics (`workload.telemetry.serve_reporter` publishes them while the RayService
    runs).

    No data means no reporter (the endpoint is being deployed or is gone) or, for latency, no request: neither
    is a breach; an endpoint that is down shows as a failed RayService in KubeRay, and its clients' errors."""
    return [
        AlarmSpec(
            key="serve-latency",
            meaning=(
                f"The endpoint's p95 request latency stayed over {watch.latency_p95_max_ms:g} ms for two periods."
            ),
            action=(
                "Check ServeReplicas: at serve.max_replicas the endpoint is saturated (raise it, or "
                "engine.max_num_seqs); below it, new replicas are waiting for a GPU node (kubectl get pods -l "
                "llm-batch.io/rayservice) or requests are long (max_tokens)."
            ),
            comparison="GreaterThanThreshold",
            threshold=watch.latency_p95_max_ms,
            evaluation_periods=2,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.SERVE_LATENCY_P95, "Maximum"),
        ),
        AlarmSpec(
            key="serve-error-ratio",
            meaning=f"More than {watch.error_ratio_max:.0%} of the endpoint's requests in a period got a 5xx.",
            action=(
                "Read the RayService head's and the replicas' logs (kubectl logs -l llm-batch.io/rayservice); "
                "engine crashes, replicas lost to node loss and requests over max_model_len are the usual causes."
            ),
            comparison="GreaterThanThreshold",
            threshold=watch.error_ratio_max,
            evaluation_periods=1,
            treat_missing_data="notBreaching",
            expression="IF(requests > 0, errors / requests)",
            inputs={
                "requests": _job_metric(namespace, stack, mn.SERVE_REQUESTS, "Sum"),
                "errors": _job_metric(namespace, stack, mn.SERVE_ERRORS, "Sum"),
            },
        ),
        AlarmSpec(
            key="serve-at-max-replicas",
            meaning=(
                f"The endpoint ran at serve.max_replicas ({watch.max_replicas}) for {watch.at_max_minutes} "
                "minutes: it cannot scale further, so requests queue."
            ),
            action=(
                "Raise serve.max_replicas (the estimate's serving line grows with it) or lower the load; "
                "check the latency alarm."
            ),
            comparison="GreaterThanOrEqualToThreshold",
            threshold=watch.max_replicas,
            evaluation_periods=max(1, watch.at_max_minutes // _PERIOD_MINUTES),
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.SERVE_REPLICAS, "Minimum"),
        ),
    ]


def batch_api_alarms(stack: str, namespace: str) -> list[AlarmSpec]:
    """A batch that failed, and one that expired, each alarms once; a batch at risk of expiring alarms while it is
    (batch_api.enabled).

    The counts come from the Batch API's functions (workload/batch_api/queue_metrics.py): every tick publishes
    them, 0 included, so the alarm returns to OK the period after; no data (the function is new, or does not
    run) is no batch closed or at risk, not a breach."""
    return [
        AlarmSpec(
            key="batch-api-failed",
            meaning="A Batch API batch failed in the last 5 minutes: its job failed, its file was deleted while "
            "it waited, or its file held no request (or too many).",
            action=(
                "Run `python -m infra.status STACK --batches` for the batch and its reason; a job that failed "
                "has its execution in `python -m infra.status STACK` (and its partial files); the owner may "
                "create the batch again: a new batch reruns every request."
            ),
            comparison="GreaterThanThreshold",
            threshold=0,
            evaluation_periods=1,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.BATCH_API_FAILED, "Sum"),
        ),
        AlarmSpec(
            key="batch-api-expired",
            meaning="A Batch API batch expired in the last 5 minutes: its 24-hour window ended before its job did "
            "(a stopped job keeps what it finished, in the batch's files).",
            action=(
                "Run `python -m infra.status STACK --batches`: a queue longer than a night (batches waiting "
                "behind one another), a run that held the GPUs (`python -m infra.status STACK`), or GPU capacity "
                "that never came are the usual causes."
            ),
            comparison="GreaterThanThreshold",
            threshold=0,
            evaluation_periods=1,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.BATCH_API_EXPIRED, "Sum"),
        ),
        AlarmSpec(
            key="batch-api-at-risk",
            meaning="A Batch API batch would not finish inside its 24-hour window at the throughput measured on "
            "the last finished batches (the rows of the batches ahead of it and its own, over rows per second); "
            "it has not expired yet.",
            action=(
                "Run `python -m infra.status STACK --batches`: each batch at risk shows the rows its window "
                "cannot hold (`llm_batch.at_risk` on the batch). Lower the priority of work that can wait "
                "(`batch_api.quotas.priorities`, or the batch's metadata `llm_batch_priority`), cancel what is "
                "not needed, or raise the throughput (a larger GPU, `engine.*`); the owner may split a batch."
            ),
            comparison="GreaterThanThreshold",
            threshold=0,
            evaluation_periods=1,
            treat_missing_data="notBreaching",
            metric=_job_metric(namespace, stack, mn.BATCH_API_AT_RISK, "Maximum"),
        ),
    ]


def billing_alarm(limit_usd: float) -> AlarmSpec:
    """Month-to-date estimated charges of the whole account over `limit_usd` (AWS/Billing: us-east-1 only)."""
    if limit_usd <= 0:
        raise ValueError(f"the billing alarm's limit must be positive, not {limit_usd}")
    return AlarmSpec(
        key="monthly-charges",
        meaning=(
            f"The whole AWS account's month-to-date estimated charges passed "
            f"${limit_usd:,.0f} (account-wide, not this stack alone)."
        ),
        action=(
            "Open Cost Explorer grouped by the cost-allocation tags to see which stack or service spends; "
            "check for GPU nodes left running outside the nightly window."
        ),
        comparison="GreaterThanThreshold",
        threshold=limit_usd,
        evaluation_periods=1,
        treat_missing_data="ignore",
        metric=MetricRef(
            mn.BILLING_NAMESPACE, mn.BILLING_METRIC, dict(mn.BILLING_DIMENSIONS), "Maximum", BILLING_PERIOD_S
        ),
    )


def evaluation_minutes(spec: AlarmSpec) -> int:
    """How long a condition must hold before the alarm fires."""
    period_s = max(ref.period_s for ref in spec.metrics())
    return math.ceil(period_s * spec.evaluation_periods / 60)
