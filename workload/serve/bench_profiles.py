"""Serving-benchmark profiles and targets, as data: the model, the engine arguments, the request rates, and which
servers are measured. Every target gets the same model and the same engine arguments."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workload.bench.profiles import LLAMA_3_1_8B_SHAPE, ModelSpec
from workload.contract.config import EngineConfig

NATIVE = "vllm"

# Ray Serve LLM with each of its recent serving features: the name the scorecard uses -> the `serve` settings.
SERVE_TARGETS: dict[str, dict[str, Any]] = {
    "serve": {"haproxy": False, "direct_streaming": False},
    "serve+haproxy": {"haproxy": True, "direct_streaming": False},
    "serve+haproxy+direct": {"haproxy": True, "direct_streaming": True},
}
TARGETS = (NATIVE, *SERVE_TARGETS)


def round_orders(targets: list[str], repeat: int) -> list[list[str]]:
    """The order targets are measured in, round by round: round r starts r places further along the list, so with
    `vllm,serve` the rounds go vllm-serve, serve-vllm, vllm-serve. On shared cores the load drifts over minutes;
    interleaving gives every target the same share of quiet and busy minutes, and no target always goes first."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if not targets:
        raise ValueError("no targets to measure")
    return [targets[r % len(targets) :] + targets[: r % len(targets)] for r in range(repeat)]


class ServeBenchProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    device: Literal["cpu", "gpu"]
    model: ModelSpec
    engine: EngineConfig
    input_len: int = Field(ge=1, description="Prompt tokens per request (vLLM's random dataset).")
    output_len: int = Field(ge=1, description="Output tokens per request (ignore_eos: exactly this many).")
    rates: list[float] = Field(description="Offered request rates, req/s; inf: all at once (saturation).")
    seconds_per_rate: float = Field(gt=0, description="A finite rate sends rate x this many requests ...")
    max_prompts: int = Field(ge=1, description="... but at most this many; the saturation point sends this many.")
    min_prompts: int = Field(ge=1, description="Fewest requests at any rate.")
    warmups: int = Field(ge=0, description="Requests before each measurement (not counted).")

    def prompts_at(self, rate: float) -> int:
        if math.isinf(rate):
            return self.max_prompts
        return max(self.min_prompts, min(self.max_prompts, round(rate * self.seconds_per_rate)))


_TINY = ModelSpec(kind="tiny", name="tiny-llama (0.4M params, random weights)")

SERVE_PROFILES: dict[str, ServeBenchProfile] = {
    "cpu": ServeBenchProfile(
        name="cpu",
        description="Embedded tiny Llama on the CPU; client and servers share the machine's cores.",
        device="cpu",
        model=_TINY,
        engine=EngineConfig(max_model_len=2048, max_num_seqs=64, enforce_eager=True, cpu_kvcache_space_gib=2),
        input_len=128,
        output_len=128,
        rates=[2.0, 8.0, math.inf],
        seconds_per_rate=20,
        max_prompts=200,
        min_prompts=32,
        warmups=8,
    ),
    "gpu": ServeBenchProfile(
        name="gpu",
        description="Llama-3.1-8B shape, dummy weights, one GPU (needs the CUDA vLLM image).",
        device="gpu",
        model=ModelSpec(kind="shape", shape=LLAMA_3_1_8B_SHAPE, name="llama-3.1-8b-shape"),
        engine=EngineConfig(max_model_len=4096, max_num_seqs=256, gpu_memory_utilization=0.90, dtype="bfloat16"),
        input_len=512,
        output_len=256,
        rates=[4.0, 16.0, 64.0, math.inf],
        seconds_per_rate=60,
        max_prompts=2000,
        min_prompts=200,
        warmups=16,
    ),
}
