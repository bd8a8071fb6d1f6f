"""`model.adapters`: LoRA adapters served beside the base model, in one engine (issue 57).

A line whose `model` names an adapter runs with that adapter's LoRA request on the same engine as the base; the
engine is built with vLLM's `enable_lora`, `max_loras` and `max_lora_rank` from this section
(`lora_engine_kwargs`). Imports neither Ray nor vLLM, so the Pulumi program and engine-plan can read it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workload.contract.model_shape import DTYPE_BYTES, ModelShape

if TYPE_CHECKING:
    from workload.contract.config import ModelConfig

# vLLM's LoRA slot sizes (vllm/config/lora.py, `MaxLoRARanks`, vLLM 0.32): `max_lora_rank` must be one of these, and
# every adapter's rank at most it. An adapter of rank 4 runs in a rank-8 slot.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# A name as a line's `model` gives it and the output reports it: no spaces or slashes, so it never reads as a path.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class AdapterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(
        description="A local folder or an s3:// prefix holding the adapter in PEFT's format (adapter_config.json "
        "and adapter_model.safetensors), trained for this base model. Fetched once per node, like the base."
    )
    rank: int = Field(
        ge=1,
        le=VLLM_LORA_RANKS[-1],
        description="The adapter's LoRA rank (`r` in its adapter_config.json, checked when the engine loads it): "
        "the engine's `max_lora_rank` is the smallest of vLLM's slot sizes (1, 8, 16, 32, 64, 128, 256, 320, 512) "
        "that holds the largest rank, and engine-plan sizes the adapters' memory by it.",
    )

    @field_validator("source")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("an adapter's source is empty")
        return value


def slot_rank(ranks: list[int]) -> int:
    """vLLM's `max_lora_rank` for adapters of these ranks: the smallest slot size that holds the largest."""
    largest = max(ranks)
    return next(size for size in VLLM_LORA_RANKS if size >= largest)


class AdapterModel(BaseModel):
    """The `adapters` field of ModelConfig (workload/contract/config.py), kept here so config.py stays one concern."""

    adapters: dict[str, AdapterConfig] = Field(
        default_factory=dict,
        description="LoRA adapters served by the same engine as the base model, by name: a request line whose "
        "`model` is one of these names runs with that adapter (and its answer reports that name). Each is "
        "{source: a local folder or s3:// prefix in PEFT's format, rank: its LoRA rank}. Names must differ from "
        "`name` and `aliases` (docs/job.md, 'LoRA adapters').",
    )

    @field_validator("adapters")
    @classmethod
    def _names(cls, value: dict[str, AdapterConfig]) -> dict[str, AdapterConfig]:
        for name in value:
            if not _NAME.match(name):
                raise ValueError(
                    f"adapter name {name!r} must be 1-128 letters, digits or . _ : - (starting with a letter or digit)"
                )
        return value

    @model_validator(mode="after")
    def _apart_from_the_base(self) -> AdapterModel:
        base = {getattr(self, "name", None), *getattr(self, "aliases", [])}
        clash = sorted(set(self.adapters) & base)
        if clash:
            raise ValueError(
                f"adapter name {clash[0]!r} is also the model's name or an alias: a line naming it would be "
                "ambiguous; rename the adapter"
            )
        return self

    def adapter_names(self) -> frozenset[str]:
        return frozenset(self.adapters)


def served_names(model: ModelConfig) -> tuple[str, ...]:
    """Every name a request's `model` may give, as GET /v1/models lists them: the model, its aliases, its adapters."""
    return (model.name, *model.aliases, *sorted(model.adapters))


def lora_engine_kwargs(adapters: dict[str, AdapterConfig], device: str) -> dict[str, Any]:
    """vLLM's LoRA engine arguments for these adapters ({} for none).

    One slot per adapter, so every adapter stays loaded all night and no batch waits for a swap. On the CPU one
    spare slot more: vLLM's CPU LoRA ops (vllm/lora/ops/torch_ops/lora_ops.py, `bgmv_*`) index the stacked adapter
    weights with each token's slot, and a base-model token's slot is -1, which PyTorch reads as the last slot: with
    every slot holding an adapter, base rows batched beside adapter rows got that adapter's delta (wrong answers,
    no error; seen here 2026-12-07 with the tiny model and adapter: one slot, a greedy base prompt beside the
    adapter's answered the adapter's text; two slots, its own). The spare last slot is never loaded, so its weights
    stay zero and -1 adds nothing. Upstream:
    vllm-project/vllm#48421 ("[Bugfix][LoRA] Skip no-LoRA tokens (index -1) in CPU torch bgmv ops", open as of
    2026-12); drop the spare slot once a vLLM with that fix is pinned. GPUs run the Triton kernels, which skip -1.
    """
    if not adapters:
        return {}
    slots = len(adapters) + (1 if device == "cpu" else 0)
    return {
        "enable_lora": True,
        "max_loras": slots,
        "max_cpu_loras": slots,
        "max_lora_rank": slot_rank([adapter.rank for adapter in adapters.values()]),
    }


def lora_bytes(shape: ModelShape, slots: int, rank: int, tp: int = 1) -> int:
    """GPU memory vLLM holds for `slots` LoRA slots of `rank`, per GPU of an engine: vLLM gives every linear layer
    of every decoder layer (qkv, o, gate_up, down) its stacked A (rank x in) and B (out x rank) buffers for all
    slots at start, whichever modules an adapter targets (vllm/lora/layers, `create_lora_weights`), in the model's
    dtype; tensor parallelism splits one side of each. MoE experts' LoRA is left out (dense layers only)."""
    hidden, heads, kv_heads, head_dim = shape.hidden_size, shape.heads, shape.kv_heads, shape.head_dim
    width = shape.intermediate_size
    qkv = 3 * rank * hidden + rank * head_dim * (heads + 2 * kv_heads)  # three A slices, one B each
    out = rank * (heads * head_dim + hidden)
    mlp = 2 * rank * hidden + rank * 2 * width + rank * (width + hidden)  # gate_up (two slices), down
    per_layer = qkv + out + mlp
    return int(slots * shape.layers * per_layer * DTYPE_BYTES[shape.dtype] / max(tp, 1))
