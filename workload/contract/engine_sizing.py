"""vLLM's engine settings from a model's `config.json` and a GPU: no weights, no GPU, no vLLM import.

The same function sizes `python -m workload engine-plan`, the job's engines at start (with the GPU's real free
memory, workload/engine/auto_settings.py) and the plan and preflight (with the tier's GPU from gpu_kinds.json), so
what the operator is shown is what the engines run with.

The arithmetic, per GPU of one engine of `tensor_parallel_size` (tp) GPUs (docs/gpu.md works it through):
- weights: the parameters counted from the architecture fields (embeddings, attention, MLP or experts, norms,
  an untied LM head), at the checkpoint's dtype (or a quantized build's bits), split over tp;
- KV bytes per token: 2 (K and V) x layers x KV heads x head_dim x the KV dtype's bytes, the KV heads split
  over tp (never below one head per GPU: vLLM replicates a head when tp exceeds their number);
- the reserve beside the KV cache: `RESERVE_GIB` (CUDA graphs, the allocator's non-torch memory, NCCL) plus the
  activation peak of one step of `max_num_batched_tokens` (vLLM profiles exactly that step at start);
- KV-cache tokens = (memory x gpu_memory_utilization - weights - reserve) / KV bytes per token;
- `max_num_seqs` = KV-cache tokens / the tokens a typical row holds (prompt + output): more is over-admission,
  which vLLM answers by preempting and recomputing; fewer leaves cache unused;
- `max_num_batched_tokens`: the largest of 16384, 8192, 4096, 2048 that is at most an eighth of the cache, so one
  step's prefill never crowds out the sequences it decodes (vLLM's optimisation guide: above 8192 for throughput);
- `tensor_parallel_size`: the smallest power of two (dividing the attention heads and the node's GPUs) whose
  cache holds one sequence of `max_model_len` (vLLM's own rule at start); engines per node = GPUs / tp.
"""

from __future__ import annotations

import json
import math
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

GPU_KINDS_FILE = Path(__file__).resolve().parent / "gpu_kinds.json"
GIB = 2**30
MIB = 2**20
# CUDA graphs (vLLM captures one per batch size up to 512), cuBLAS workspaces, the caching allocator's slack and
# NCCL's buffers: memory vLLM holds beside weights, activations and cache. An estimate; tools/gpu_check.py measures it.
RESERVE_GIB = 1.0
BATCHED_TOKEN_STEPS = (16384, 8192, 4096, 2048)
MAX_NUM_SEQS_CAP = 1024  # vLLM's own largest default (H100); beyond it the scheduler's step time grows
MAX_TP = 8
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
DEFAULT_ROW_TOKENS = 600


class SizingError(ValueError):
    """A model that cannot fit, or a config.json this cannot read; the message names the fix."""


class GpuKind(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mib: int = Field(gt=0)
    memory_bandwidth_gbs: float = Field(gt=0, description="Peak memory bandwidth, GB/s: what bounds decoding")
    compute_capability: str
    bf16: bool
    instance_types: list[str]


class GpuKinds(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    checked: date
    source: str = Field(min_length=20)
    how: str = Field(min_length=10)
    kinds: dict[str, GpuKind]


@cache
def gpu_kinds() -> GpuKinds:
    return GpuKinds.model_validate_json(GPU_KINDS_FILE.read_text())


def gpu_kind(name: str) -> GpuKind:
    try:
        return gpu_kinds().kinds[name]
    except KeyError:
        raise SizingError(f"unknown GPU kind {name!r}: one of {', '.join(gpu_kinds().kinds)}") from None


def kind_of_instance(instance_type: str) -> str | None:
    """The GPU kind an EC2 instance type carries, or None (a CPU type, or one the table does not know)."""
    return next((name for name, kind in gpu_kinds().kinds.items() if instance_type in kind.instance_types), None)


class ModelShape(BaseModel):
    """The architecture fields of a `config.json` that decide memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    max_position_embeddings: int
    experts: int = 1  # MoE: experts per layer (each an MLP of intermediate_size)
    experts_per_token: int = 1
    qkv_bias: bool = False
    dtype: str = "bfloat16"
    weight_bits: int = 16  # of the linear layers: 4 for an AWQ/GPTQ build, 8 for FP8

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str = "model") -> ModelShape:
        text = config.get("text_config")
        fields = {**config, **text} if isinstance(text, dict) else config  # multimodal configs nest the LM
        missing = [
            k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in fields
        ]
        if missing:
            raise SizingError(f"{name}: config.json has no {', '.join(missing)}: not a decoder model this can size")
        heads = int(fields["num_attention_heads"])
        hidden = int(fields["hidden_size"])
        dtype = str(fields.get("torch_dtype") or fields.get("dtype") or "bfloat16")
        if dtype not in DTYPE_BYTES:
            raise SizingError(f"{name}: config.json's torch_dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        return cls(
            name=name,
            hidden_size=hidden,
            intermediate_size=int(fields.get("intermediate_size") or 4 * hidden),
            layers=int(fields["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(fields.get("num_key_value_heads") or heads),
            head_dim=int(fields.get("head_dim") or hidden // heads),
            vocab_size=int(fields["vocab_size"]),
            tied_embeddings=bool(fields.get("tie_word_embeddings", False)),
            max_position_embeddings=int(fields.get("max_position_embeddings") or 2048),
            experts=int(fields.get("num_local_experts") or fields.get("num_experts") or 1),
            experts_per_token=int(fields.get("num_experts_per_tok") or 1),
            # Qwen2 puts a bias on q, k and v; Llama and Mixtral declare `attention_bias` (false).
            qkv_bias=bool(fields.get("attention_bias", fields.get("model_type") == "qwen2")),
            dtype=dtype,
            weight_bits=_weight_bits(fields.get("quantization_config"), name),
        )

    def parameters(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        if self.qkv_bias:
            attention += self.head_dim * (self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size * self.experts  # gate, up, down per expert
        router = self.hidden_size * self.experts if self.experts > 1 else 0
        per_layer = attention + mlp + router + 2 * self.hidden_size  # two RMSNorms
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden_size

    def weight_bytes(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        dense = DTYPE_BYTES[self.dtype]
        linear = self.parameters() - embeddings  # quantized builds keep embeddings and head at the dense dtype
        return int(embeddings * dense + linear * self.weight_bits / 8)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        kv_heads_per_gpu = max(1, math.ceil(self.kv_heads / tp))
        return 2 * self.layers * kv_heads_per_gpu * self.head_dim * DTYPE_BYTES[self.dtype]

    def activation_bytes(self, batched_tokens: int, seqs: int, tp: int) -> int:
        """One step's peak beside the cache: the widest layer's inputs and outputs for every batched token, and
        the float32 logits of every sequence sampled in that step."""
        qkv = self.head_dim * (self.heads + 2 * self.kv_heads) // tp
        mlp = 2 * self.intermediate_size * max(1, self.experts_per_token) // tp
        per_token = (2 * self.hidden_size + qkv + mlp) * DTYPE_BYTES[self.dtype]
        return batched_tokens * per_token + seqs * self.vocab_size * 4


def _weight_bits(quantization: Any, name: str) -> int:
    if not quantization:
        return 16
    method = str(quantization.get("quant_method", "")).lower()
    if method in {"awq", "gptq"}:
        return int(quantization.get("bits", 4))
    if method in {"fp8", "fbgemm_fp8"}:
        return 8
    raise SizingError(f"{name}: quantization method {method!r} is not one this can size (awq, gptq, fp8)")


def read_model_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder).expanduser() / "config.json"
    if not path.is_file():
        raise SizingError(f"{folder}: no config.json (a model folder holds one beside its weights)")
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SizingError(f"{path} is not JSON: {error}") from None
    if not isinstance(loaded, dict):
        raise SizingError(f"{path} must hold a JSON object")
    return loaded


class EnginePlan(BaseModel):
    """One engine's settings and the figures they come from; what `engine-plan` prints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    gpu: str
    gpus: int
    parameters_b: float
    weights_gib: float = Field(description="All weights; each GPU of an engine holds weights_gib / tp")
    kv_bytes_per_token: int = Field(description="Per GPU of an engine")
    gpu_memory_gib: float = Field(description="What the sizing started from: the kind's total, or the real free")
    gpu_memory_utilization: float
    reserve_gib: float = Field(description="Per GPU: CUDA graphs and workspaces plus one step's activations")
    kv_cache_gib: float = Field(description="Per GPU")
    kv_cache_tokens: int = Field(description="Per engine: the tokens its cache holds at once")
    row_tokens: int = Field(description="A typical row's prompt + output tokens, the unit of max_num_seqs")
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int
    engines_per_node: int

    def engine_kwargs(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }


def _tp_candidates(shape: ModelShape, gpus: int) -> list[int]:
    return [tp for tp in (1, 2, 4, 8) if tp <= min(gpus, MAX_TP) and shape.heads % tp == 0 and gpus % tp == 0]


def _size_at(
    shape: ModelShape,
    gpu: str,
    memory_bytes: int,
    gpus: int,
    tp: int,
    utilization: float,
    max_model_len: int,
    row_tokens: int,
) -> EnginePlan | None:
    """The plan at one tensor-parallel size, or None where its cache cannot hold one max_model_len sequence."""
    weights_per_gpu = shape.weight_bytes() / tp
    usable = memory_bytes * utilization - weights_per_gpu - RESERVE_GIB * GIB
    kv_per_token = shape.kv_bytes_per_token(tp)
    for batched in BATCHED_TOKEN_STEPS:
        seqs_guess = max(1, min(MAX_NUM_SEQS_CAP, int(usable // kv_per_token) // max(row_tokens, 1)))
        cache_bytes = usable - shape.activation_bytes(batched, seqs_guess, tp)
        tokens = int(cache_bytes // kv_per_token) if cache_bytes > 0 else 0
        if batched * 8 <= tokens or batched == BATCHED_TOKEN_STEPS[-1]:
            break
    if tokens < max_model_len:
        return None
    reserve = RESERVE_GIB * GIB + shape.activation_bytes(batched, seqs_guess, tp)
    return EnginePlan(
        model=shape.name,
        gpu=gpu,
        gpus=gpus,
        parameters_b=round(shape.parameters() / 1e9, 2),
        weights_gib=round(shape.weight_bytes() / GIB, 2),
        kv_bytes_per_token=kv_per_token,
        gpu_memory_gib=round(memory_bytes / GIB, 2),
        gpu_memory_utilization=utilization,
        reserve_gib=round(reserve / GIB, 2),
        kv_cache_gib=round(tokens * kv_per_token / GIB, 2),
        kv_cache_tokens=tokens,
        row_tokens=row_tokens,
        max_model_len=max_model_len,
        max_num_seqs=max(1, min(MAX_NUM_SEQS_CAP, tokens // max(row_tokens, 1))),
        # vLLM refuses a step budget below max_model_len with chunked prefill off; with it on, any budget works.
        max_num_batched_tokens=batched,
        tensor_parallel_size=tp,
        engines_per_node=gpus // tp,
    )


def plan_engine(
    shape: ModelShape,
    gpu: str,
    gpus: int = 1,
    *,
    max_model_len: int = 2048,
    gpu_memory_utilization: float = 0.90,
    row_tokens: int = DEFAULT_ROW_TOKENS,
    tensor_parallel_size: int | None = None,
    memory_bytes: int | None = None,
) -> EnginePlan:
    """The smallest tensor-parallel size that fits (or the one given) and the settings it gives.
    `memory_bytes`: one GPU's memory to size from (the real free memory at start); default the kind's total."""
    if gpus < 1:
        raise SizingError(f"--gpus must be at least 1, got {gpus}")
    if max_model_len > shape.max_position_embeddings:
        raise SizingError(
            f"max_model_len {max_model_len} is more than {shape.name}'s max_position_embeddings "
            f"{shape.max_position_embeddings}"
        )
    kind = gpu_kind(gpu)
    memory = memory_bytes if memory_bytes is not None else kind.memory_mib * MIB
    candidates = [tensor_parallel_size] if tensor_parallel_size is not None else _tp_candidates(shape, gpus)
    if tensor_parallel_size is not None and (tensor_parallel_size > gpus or shape.heads % tensor_parallel_size):
        raise SizingError(
            f"tensor_parallel_size {tensor_parallel_size} needs {tensor_parallel_size} GPUs that split "
            f"{shape.name}'s {shape.heads} attention heads evenly; the node has {gpus}"
        )
    for tp in candidates:
        plan = _size_at(shape, gpu, memory, gpus, tp, gpu_memory_utilization, max_model_len, row_tokens)
        if plan is not None:
            return plan
    raise SizingError(_cannot_fit(shape, gpu, gpus, memory, max_model_len, gpu_memory_utilization, candidates))


def _cannot_fit(
    shape: ModelShape, gpu: str, gpus: int, memory: int, max_model_len: int, utilization: float, tried: list[int]
) -> str:
    largest = max(tried) if tried else 1
    fixes = []
    more = next(
        (
            tp
            for tp in (2, 4, 8)
            if tp > largest
            and shape.heads % tp == 0
            and _size_at(shape, gpu, memory, tp, tp, utilization, max_model_len, DEFAULT_ROW_TOKENS) is not None
        ),
        None,
    )
    if more is not None:
        fixes.append(f"tensor parallel over {more} {gpu} GPUs (--gpus {more})")
    if shape.weight_bits == 16:
        four_bit = shape.model_copy(update={"weight_bits": 4})
        if any(
            _size_at(four_bit, gpu, memory, gpus, tp, utilization, max_model_len, DEFAULT_ROW_TOKENS) for tp in tried
        ):
            fixes.append(f"a 4-bit quantized build (AWQ/GPTQ, about {four_bit.weight_bytes() / GIB:.0f} GiB)")
    larger = [
        name
        for name, kind in sorted(gpu_kinds().kinds.items(), key=lambda item: item[1].memory_mib)
        if kind.memory_mib * MIB > memory
        and any(
            _size_at(shape, name, kind.memory_mib * MIB, gpus, tp, utilization, max_model_len, DEFAULT_ROW_TOKENS)
            for tp in _tp_candidates(shape, gpus)
        )
    ]
    if larger:
        fixes.append(f"a larger GPU ({', '.join(larger)} x {gpus})")
    if not fixes:
        fixes.append(f"a shorter max_model_len than {max_model_len}")
    per_gpu = shape.weight_bytes() / GIB / largest
    return (
        f"{shape.name} cannot fit on {gpus} x {gpu}: {shape.weight_bytes() / GIB:.1f} GiB of weights "
        f"({per_gpu:.1f} GiB a GPU at tensor_parallel_size {largest}) leave no room for the KV cache of one "
        f"{max_model_len}-token sequence in {memory / GIB:.1f} GiB x {utilization}; use " + " or ".join(fixes)
    )
