"""One finished request, timed the same way in every mode.

Every mode reads the same per-request timestamps from vLLM's `RequestStateStats` (the `metrics` of a
RequestOutput, which Ray Data LLM passes through as a dict): the frontend's arrival time (wall clock) and
the engine core's queued / scheduled / first-token / last-token times (CLOCK_MONOTONIC, which is one clock
for every process on a Linux host). The arrival time is moved onto the monotonic clock with the
wall-minus-monotonic offset taken in the process that read it, so all five lie on one time line. Nothing is
timed by the benchmark's own code around the engine, so the three modes cannot differ in how they are
measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


def wall_to_monotonic_offset() -> float:
    """time.time() - time.monotonic() in this process (stable while the host clock is not stepped)."""
    return time.time() - time.monotonic()


@dataclass(frozen=True)
class RequestRecord:
    bench_id: int
    kind: str
    expected_tokens: int
    output_tokens: int
    prompt_tokens: int
    arrival: float  # monotonic seconds: the request reached the engine's frontend
    queued: float  # the engine core queued it
    scheduled: float  # first scheduled (prefill began)
    first_token: float
    last_token: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.output_tokens == self.expected_tokens

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)


class MissingMetricsError(RuntimeError):
    """vLLM returned no per-request timestamps: the engine ran with disable_log_stats=True."""


def record_from_metrics(
    *,
    bench_id: int,
    kind: str,
    expected_tokens: int,
    output_tokens: int,
    prompt_tokens: int,
    metrics: dict[str, Any] | None,
    offset: float,
    error: str = "",
) -> RequestRecord:
    """A record from a RequestStateStats dict; `offset`: `wall_to_monotonic_offset()` of the reader."""
    if error:
        return RequestRecord(bench_id, kind, expected_tokens, 0, prompt_tokens, 0.0, 0.0, 0.0, 0.0, 0.0, error)
    if not metrics or not metrics.get("last_token_ts"):
        raise MissingMetricsError(
            f"request {bench_id} came back without vLLM's per-request timestamps; "
            "the engine must run with disable_log_stats=False"
        )
    return RequestRecord(
        bench_id=bench_id,
        kind=kind,
        expected_tokens=expected_tokens,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        arrival=float(metrics["arrival_time"]) - offset,
        queued=float(metrics["queued_ts"]),
        scheduled=float(metrics["scheduled_ts"]),
        first_token=float(metrics["first_token_ts"]),
        last_token=float(metrics["last_token_ts"]),
    )
