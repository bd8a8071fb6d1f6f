"""The job's metrics sink, chosen by config: nothing for the local demo, CloudWatch on the tiers.

Its own module because it sits above both sinks: `workload.telemetry.cloudwatch` builds on `workload.telemetry.metrics`.
"""

from __future__ import annotations

from workload.contract.config import MetricsConfig
from workload.telemetry.metrics import NullMetrics, RunMetrics


def open_metrics(config: MetricsConfig, run_id: str) -> RunMetrics:
    """The sink `metrics.sink` names; CloudWatch's client is imported only when it is asked for."""
    if config.sink == "none":
        return NullMetrics()
    from workload.telemetry.cloudwatch import CloudWatchMetrics

    return CloudWatchMetrics(config, run_id)
