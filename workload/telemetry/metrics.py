"""What the job reports while it runs: the interface the job calls, and the no-op sink of the local demo.

The CloudWatch implementation (metrics + logs) lives in `workload.telemetry.cloudwatch`, which builds on this module;
`workload.telemetry.metric_sinks.open_metrics` picks one by config so the demo never calls AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class BatchReport:
    """One engine batch as the driver received it."""

    duration_s: float  # the batch's time in the engine (its slowest row's time_taken_llm)
    rows_ok: int
    rows_failed: int
    input_tokens: int
    output_tokens: int


class RunMetrics(Protocol):
    def batch_complete(self, batch: BatchReport) -> None: ...

    def rows_rejected(self, count: int) -> None:
        """Rows that failed validation before any engine saw them: failed rows, but no batch latency."""

    def run_complete(self, summary: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullMetrics:
    """Publishes nothing: the local demo and tests without a metrics sink."""

    def batch_complete(self, batch: BatchReport) -> None:
        pass

    def rows_rejected(self, count: int) -> None:
        pass

    def run_complete(self, summary: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
