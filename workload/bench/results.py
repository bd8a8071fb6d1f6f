"""What a worker hands back to the orchestrator for one (point, mode): the raw material of the scorecard."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workload.bench.records import RequestRecord

MODES = ("synchronous", "continuous", "job")
# The bare engine in the job's process layout (the like-for-like baseline): continuous, on the bimodal point only.
JOB_LAYOUT_MODE = "continuous_job_layout"


@dataclass
class ModeRun:
    point: str
    mode: str
    startup_s: float  # engine modes: building the LLM engine; job: execution start to the first engine arrival
    submitted: float  # monotonic: the workload was handed over (engine modes: first generate; job: execution start)
    finished: float  # monotonic: the last result was back in the worker
    peak_memory_bytes: int
    memory_source: str
    records: list[RequestRecord] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "mode": self.mode,
            "startup_s": self.startup_s,
            "submitted": self.submitted,
            "finished": self.finished,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_source": self.memory_source,
            "records": [record.to_json() for record in self.records],
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModeRun:
        records = [RequestRecord.from_json(item) for item in data["records"]]
        return cls(**{**data, "records": records})
