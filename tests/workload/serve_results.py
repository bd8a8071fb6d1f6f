"""A `vllm bench serve` result as the serving scorecard reads it: the fields it uses, under vLLM 0.32's names."""

from __future__ import annotations

from typing import Any


def bench_result(throughput: float, ttft_p99: float, completed: int = 40) -> dict[str, Any]:
    """One rate's result: 40 prompts of 128 output tokens, `completed` of them answered."""
    return {
        "num_prompts": 40,
        "completed": completed,
        "request_throughput": throughput / 128,
        "output_throughput": throughput,
        "p50_ttft_ms": ttft_p99 / 2,
        "p99_ttft_ms": ttft_p99,
        "p95_itl_ms": 3.0,
        "p95_e2el_ms": 900.0,
    }
