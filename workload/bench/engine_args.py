"""The vLLM engine arguments of the engine modes: the job's own, so the modes cannot drift apart."""

from __future__ import annotations

from typing import Any

from workload.contract.config import JobConfig


def engine_kwargs(config: JobConfig, model_path: str) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM`: exactly what the job's pipeline gives its engine, plus the model.

    Per-request timestamps are what the scorecard is made of, so stats logging is on: `vllm.LLM` turns it off
    by default, while the async engine inside Ray Data LLM leaves it on (the job gets the same behaviour).
    """
    from workload.engine.pipeline import engine_kwargs as job_engine_kwargs

    return {**job_engine_kwargs(config), "model": model_path, "disable_log_stats": False}
