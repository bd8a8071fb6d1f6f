"""The Batch API queue's metrics on the tiers: CloudWatch Embedded Metric Format (EMF) lines the functions print.

Why EMF and not PutMetricData: a Lambda function's standard output goes to its log group, and CloudWatch Logs
extracts the metrics of every line that follows the EMF specification (AWS, "Using the embedded metric format
with Lambda", docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Lambda.html,
seen 2026-12-02). So no API call in the tick (nothing to retry or time out), no `cloudwatch:PutMetricData` in the
role (that action takes no resource; the `cloudwatch:namespace` condition would be the only bound), no metric
filter to keep in step: the role already writes its own log group, and that is all EMF needs. The cost of it: a
line is lost if the invocation times out before it prints (the same page's note), which undercounts, never
double counts.

What is published (names: workload.contract.metric_names; the `Stack` dimension alone, as every alarm reads):
- every tick, after it: `BatchApiQueued` (validating) and `BatchApiRunning` (in_progress, finalizing,
  cancelling), counted in the store; `BatchApiAtRisk`, the open batches the tick found would not finish in
  their window at the measured throughput (at_risk.py); and `BatchApiFailed` / `BatchApiExpired`, the batches
  this tick closed so (0 when none, so the graph shows the quiet ticks).
- after a request of the HTTP function that closed a batch (created failed: its file holds no request, or too
  many): that request's `BatchApiFailed`, alone.
Each close is counted by the service whose write closed the batch (batches.BatchBook), and each line takes what
it counts (`take_closed`), so a batch is counted once: never by two ticks, nor by a tick and a request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workload.batch_api.objects import ACTIVE
from workload.batch_api.service import BatchService
from workload.contract import metric_names as mn


@dataclass(frozen=True)
class QueueMetrics:
    namespace: str  # the stack's monitoring.metrics_namespace: the alarms and the dashboard read it there
    stack: str  # the `Stack` dimension

    def __post_init__(self) -> None:
        if not self.namespace or self.namespace.startswith("AWS/"):
            raise ValueError(f"not a custom metrics namespace: {self.namespace!r} (AWS/ is AWS's own)")
        if not self.stack:
            raise ValueError("the queue's metrics need the stack's name (the Stack dimension)")

    def document(self, values: Mapping[mn.MetricName, int], timestamp_ms: int) -> dict[str, Any]:
        """One EMF log event: the metrics' directive under `_aws`, their values and the dimension at the top."""
        directive = {
            "Namespace": self.namespace,
            "Dimensions": [[mn.DIM_STACK]],
            "Metrics": [{"Name": metric.name, "Unit": metric.unit} for metric in values],
        }
        return {
            "_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [directive]},
            mn.DIM_STACK: self.stack,
            **{metric.name: value for metric, value in values.items()},
        }

    def after_tick(self, service: BatchService) -> str:
        """The tick's line: the queue as the tick left it, and the batches it closed failed or expired."""
        statuses = service.statuses()
        closed = service.take_closed()
        values = {
            mn.BATCH_API_QUEUED: statuses.count("validating"),
            mn.BATCH_API_RUNNING: sum(1 for status in statuses if status in ACTIVE),
            mn.BATCH_API_FAILED: closed["failed"],
            mn.BATCH_API_EXPIRED: closed["expired"],
            mn.BATCH_API_AT_RISK: service.at_risk(),
        }
        return json.dumps(self.document(values, service.now() * 1000), sort_keys=True)

    def after_request(self, service: BatchService) -> str | None:
        """A request's line, only when it closed a batch failed or expired (most close none: no line)."""
        closed = service.take_closed()
        values = {
            metric: closed[status]
            for metric, status in ((mn.BATCH_API_FAILED, "failed"), (mn.BATCH_API_EXPIRED, "expired"))
            if closed[status]
        }
        return json.dumps(self.document(values, service.now() * 1000), sort_keys=True) if values else None
