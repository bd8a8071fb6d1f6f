"""The vLLM engine arguments of a profile: one function, so the engine modes and the job cannot drift."""

from __future__ import annotations

from typing import Any

from workload.config import JobConfig


def engine_kwargs(config: JobConfig, model_path: str) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM` / `AsyncEngineArgs`, from the same engine section the job gets.

    Per-request timestamps are what the scorecard is made of, so stats logging is always on
    (`vllm.LLM` turns it off by default; the async engine inside Ray Data LLM leaves it on).
    """
    engine = config.engine
    kwargs: dict[str, Any] = {
        "model": model_path,
        "load_format": config.model.load_format,
        "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "enforce_eager": engine.enforce_eager,
        "dtype": engine.dtype,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "seed": engine.seed,
        "disable_log_stats": False,
    }
    if engine.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = engine.max_num_batched_tokens
    if config.device == "gpu":
        kwargs["gpu_memory_utilization"] = engine.gpu_memory_utilization
    kwargs.update(engine.extra)
    return kwargs
