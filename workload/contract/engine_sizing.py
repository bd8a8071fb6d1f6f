"""vLLM's engine settings from a model's `config.json` and a GPU: no weights, no GPU, no vLLM import.

The same function sizes `python -m workload engine-plan`, the job's engines at start (with the GPU's real free
memory, workload/engine/auto_settings.py) and the plan and preflight (with the tier's GPU from gpu_kinds.json), so
what the operator is shown is what the engines run with. The model's side (parameters, quantised bytes, KV bytes,
activations) is model_shape.py's.

The arithmetic, per GPU of one engine of `tensor_parallel_size` (tp) GPUs (docs/gpu.md works it through), as vLLM
accounts for it at start (its `determine_available_memory`):
- memory: what CUDA reports as the GPU's total (the kinds table's `cuda_total_mib`, a little under nvidia-smi's
  total), times `gpu_memory_utilization`; at start, the real free memory where that is less;
- weights: model_shape.py's bytes, split over tp;
- the non-KV reserve: `GRAPHS_AND_NON_TORCH_GIB` (CUDA graphs, cuBLAS workspaces, the allocator's non-torch memory),
  fitted to published start-up logs (tests/workload/data/vllm_start_logs.json), plus the peak vLLM profiles: one
  forward step of `max_num_batched_tokens`, or the sampler over `max_num_seqs` rows of logits, whichever is larger;
- KV-cache tokens = (memory x utilisation - weights - reserve) / KV bytes per token;
- `max_num_seqs` = KV-cache tokens / the tokens a typical row holds (prompt + output), at most 1024: more is
  over-admission, which vLLM answers by preempting and recomputing; fewer leaves cache unused;
- `max_num_batched_tokens`: the largest of 16384, 8192, 4096, 2048 that is at most an eighth of the cache, so one
  step's prefill never crowds out the sequences it decodes (vLLM's optimisation guide: above 8192 for throughput);
- `tensor_parallel_size` and engines per node: every power of two that divides the attention heads and the node's
  GPUs and whose cache holds one `max_model_len` sequence is scored (`layout_speed`: output tokens/s a node for the
  typical row, decode bound by the engine's memory bandwidth or compute, its all-reduces, prefill counted), and the
  fastest is taken; the plan names the runner-up and why it lost. A pinned tensor_parallel_size is taken as given.
"""

from __future__ import annotations

import json
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workload.contract.adapter_config import lora_bytes
from workload.contract.model_shape import DTYPE_BYTES, ModelShape, SizingError

__all__ = ["DTYPE_BYTES", "EnginePlan", "ModelShape", "SizingError", "plan_engine"]

GPU_KINDS_FILE = Path(__file__).resolve().parent / "gpu_kinds.json"
GIB = 2**30
MIB = 2**20
# What vLLM's profile finds beside the weights and the activation peak: CUDA graphs (captured for batch sizes up to
# 512), cuBLAS workspaces, the CUDA context's growth, NCCL. Fitted to the published A10G start-up log of
# tests/workload/data/vllm_start_logs.json (test_engine_sizing holds the fit); tools/gpu_check.py measures it.
GRAPHS_AND_NON_TORCH_GIB = 1.25
RESERVE_GIB = GRAPHS_AND_NON_TORCH_GIB  # the name tools/gpu_probe_proposal.py reports against
BATCHED_TOKEN_STEPS = (16384, 8192, 4096, 2048)
MAX_NUM_SEQS_CAP = 1024  # vLLM's own largest default (H100); beyond it the scheduler's step time grows
MAX_TP = 8
DEFAULT_ROW_TOKENS = 600
# The layout score's roofline: a step reads at the datasheet bandwidth x BANDWIDTH_EFFICIENCY (infra/pricing/
# managed_batch.json's `throughput` gives the source) and multiplies at the dense BF16 peak x MFU; each layer's two
# all-reduces cost ALLREDUCE_LATENCY_S plus their bytes at the kind's bus bandwidth.
BANDWIDTH_EFFICIENCY = 0.6
MFU = 0.5
ALLREDUCE_LATENCY_S = 15e-6


class GpuKind(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mib: int = Field(gt=0, description="nvidia-smi's memory.total")
    cuda_total_mib: int = Field(gt=0, description="CUDA's total (torch.cuda.mem_get_info): vLLM's base")
    bf16_tflops: float = Field(gt=0, description="Dense BF16 tensor-core peak, TFLOP/s: what bounds prefill")
    interconnect_gbs: float = Field(gt=0, description="All-reduce bus bandwidth between a node's GPUs, GB/s")
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
    active_parameters_b: float = Field(description="Multiplied per token: MoE's routed experts at their share")
    quantization: str = Field(description="The checkpoint's format and bits of its quantised parts, or its dtype")
    weights_gib: float = Field(description="All weights; each GPU of an engine holds weights_gib / tp")
    kv_bytes_per_token: int = Field(description="Per GPU of an engine")
    gpu_memory_gib: float = Field(description="What the sizing started from: CUDA's total for the kind, or the free")
    gpu_memory_utilization: float
    reserve_gib: float = Field(description="Per GPU: CUDA graphs and non-torch memory plus the profiled peak")
    lora_gib: float = Field(0.0, description="Per GPU: the LoRA adapters' slots (`model.adapters`), 0 without")
    kv_cache_gib: float = Field(description="Per GPU")
    kv_cache_tokens: int = Field(description="Per engine: the tokens its cache holds at once")
    row_tokens: int = Field(description="A typical row's prompt + output tokens, the unit of max_num_seqs")
    prompt_tokens: int = Field(description="Of row_tokens, the prompt's: prefilled, not decoded")
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int
    engines_per_node: int
    output_tokens_per_s: float = Field(description="A node's, all its engines full (layout_speed's roofline)")
    bound_by: str = Field(description="What limits a decode step: memory bandwidth or compute")
    runner_up: str | None = Field(None, description="The next-best layout on this node and why it lost")

    def engine_kwargs(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }


class LayoutSpeed(BaseModel):
    """One engine layout's roofline: output tokens/s of an engine and of the node, and the step's parts."""

    model_config = ConfigDict(frozen=True)

    engine_tokens_per_s: float
    node_tokens_per_s: float
    step_s: float
    memory_s: float
    compute_s: float
    allreduce_s: float
    prefill_s_per_row: float

    @property
    def bound_by(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory bandwidth"


def layout_speed(
    shape: ModelShape,
    gpu: str,
    tp: int,
    seqs: int,
    engines: int,
    prompt_tokens: int,
    output_tokens: int,
    efficiency: float = BANDWIDTH_EFFICIENCY,
) -> LayoutSpeed:
    """Output tokens/s of an engine of `tp` GPUs whose `seqs` sequences of `prompt_tokens` + `output_tokens` all
    decode, each GPU in parallel:
    - a decode step reads the GPU's share of the weights (of a MoE's experts those any of the step's tokens route
      to) and every sequence's cache at its mean context (prompt + half the output), at the bandwidth x efficiency;
      or, where longer, multiplies the active parameters for every sequence at the BF16 peak x MFU;
    - each layer's two all-reduces of the step's hidden states over the engine's GPUs;
    - prefill: each row's prompt through the active parameters at the peak x MFU (compute-bound), in the engine's
      time, so output tokens/s = output tokens / (decode time + prefill time) of a row."""
    kind = gpu_kind(gpu)
    experts = shape.expert_bytes()
    touched = 1 - (1 - shape.experts_per_token / shape.experts) ** seqs if shape.experts > 1 else 1
    weights = (shape.weight_bytes() - experts + experts * touched) / tp
    context = prompt_tokens + output_tokens / 2
    bandwidth = kind.memory_bandwidth_gbs * 1e9 * efficiency
    memory_s = (weights + seqs * context * shape.kv_bytes_per_token(tp)) / bandwidth
    flops = kind.bf16_tflops * 1e12 * MFU * tp
    compute_s = 2 * shape.active_parameters() * seqs / flops

    def allreduce(tokens: int) -> float:
        if tp == 1:
            return 0.0
        payload = 2 * (tp - 1) / tp * tokens * shape.hidden_size * DTYPE_BYTES[shape.dtype]
        return 2 * shape.layers * (ALLREDUCE_LATENCY_S + payload / (kind.interconnect_gbs * 1e9))

    step_s = max(memory_s, compute_s) + allreduce(seqs)
    prefill_s = 2 * shape.active_parameters() * prompt_tokens / flops + allreduce(prompt_tokens)
    row_s = output_tokens * step_s / seqs + prefill_s
    engine = output_tokens / row_s
    return LayoutSpeed(
        engine_tokens_per_s=engine,
        node_tokens_per_s=engine * engines,
        step_s=step_s,
        memory_s=memory_s,
        compute_s=compute_s,
        allreduce_s=allreduce(seqs),
        prefill_s_per_row=prefill_s,
    )


def _tp_candidates(shape: ModelShape, gpus: int) -> list[int]:
    return [tp for tp in (1, 2, 4, 8) if tp <= min(gpus, MAX_TP) and shape.heads % tp == 0 and gpus % tp == 0]


def reserve_bytes(shape: ModelShape, batched: int, seqs: int, tp: int) -> int:
    return int(GRAPHS_AND_NON_TORCH_GIB * GIB) + shape.activation_bytes(batched, seqs, tp)


def _quantization(shape: ModelShape) -> str:
    if not shape.quant_method:
        return shape.dtype
    return f"{shape.quant_method}: {shape.weight_bits:g} bits a weight of {', '.join(shape.quantized_parts)}"


def _size_at(
    shape: ModelShape,
    gpu: str,
    memory_bytes: int,
    gpus: int,
    tp: int,
    utilization: float,
    max_model_len: int,
    row_tokens: int,
    prompt_tokens: int | None = None,
    lora: tuple[int, int] | None = None,
) -> EnginePlan | None:
    """The plan at one tensor-parallel size, or None where its cache cannot hold one max_model_len sequence.
    `lora`: (slots, rank) of the engine's LoRA adapters, whose buffers come out of the cache's memory."""
    prompt = prompt_tokens if prompt_tokens is not None else row_tokens * 2 // 3
    weights_per_gpu = shape.weight_bytes() / tp
    adapters = lora_bytes(shape, lora[0], lora[1], tp) if lora else 0
    usable = memory_bytes * utilization - weights_per_gpu - adapters
    kv_per_token = shape.kv_bytes_per_token(tp)
    for batched in BATCHED_TOKEN_STEPS:
        seqs_guess = max(1, min(MAX_NUM_SEQS_CAP, int(usable // kv_per_token) // max(row_tokens, 1)))
        cache_bytes = usable - reserve_bytes(shape, batched, seqs_guess, tp)
        tokens = int(cache_bytes // kv_per_token) if cache_bytes > 0 else 0
        if batched * 8 <= tokens or batched == BATCHED_TOKEN_STEPS[-1]:
            break
    if tokens < max_model_len:
        return None
    seqs = max(1, min(MAX_NUM_SEQS_CAP, tokens // max(row_tokens, 1)))
    speed = layout_speed(shape, gpu, tp, seqs, gpus // tp, prompt, max(1, row_tokens - prompt))
    return EnginePlan(
        model=shape.name,
        gpu=gpu,
        gpus=gpus,
        parameters_b=round(shape.parameters() / 1e9, 2),
        active_parameters_b=round(shape.active_parameters() / 1e9, 2),
        quantization=_quantization(shape),
        weights_gib=round(shape.weight_bytes() / GIB, 2),
        kv_bytes_per_token=kv_per_token,
        gpu_memory_gib=round(memory_bytes / GIB, 2),
        gpu_memory_utilization=utilization,
        reserve_gib=round(reserve_bytes(shape, batched, seqs_guess, tp) / GIB, 2),
        lora_gib=round(adapters / GIB, 3),
        kv_cache_gib=round(tokens * kv_per_token / GIB, 2),
        kv_cache_tokens=tokens,
        row_tokens=row_tokens,
        prompt_tokens=prompt,
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        # vLLM refuses a step budget below max_model_len with chunked prefill off; with it on, any budget works.
        max_num_batched_tokens=batched,
        tensor_parallel_size=tp,
        engines_per_node=gpus // tp,
        output_tokens_per_s=round(speed.node_tokens_per_s, 1),
        bound_by=speed.bound_by,
    )


def _why_slower(best: EnginePlan, other: EnginePlan) -> str:
    loss = 1 - other.output_tokens_per_s / best.output_tokens_per_s
    held = other.max_num_seqs * other.engines_per_node
    best_held = best.max_num_seqs * best.engines_per_node
    if held < best_held * 0.9:
        reason = f"its caches hold {held:,} sequences a node against {best_held:,}"
    elif other.tensor_parallel_size > best.tensor_parallel_size:
        reason = f"each step's all-reduces span {other.tensor_parallel_size} GPUs for {held:,} sequences"
    else:
        reason = f"its steps are {other.bound_by}-bound with fewer GPUs an engine"
    return (
        f"tp{other.tensor_parallel_size} x {other.engines_per_node}: {other.output_tokens_per_s:,.0f} output tok/s "
        f"a node, {loss:.0%} less: {reason}"
    )


def plan_engine(
    shape: ModelShape,
    gpu: str,
    gpus: int = 1,
    *,
    max_model_len: int = 2048,
    gpu_memory_utilization: float = 0.90,
    row_tokens: int = DEFAULT_ROW_TOKENS,
    prompt_tokens: int | None = None,
    tensor_parallel_size: int | None = None,
    memory_bytes: int | None = None,
    lora: tuple[int, int] | None = None,
) -> EnginePlan:
    """The fastest layout that fits the node (or the tensor-parallel size given) and the settings it gives.
    `memory_bytes`: one GPU's memory to size from (the real free memory at start); default CUDA's total for the
    kind. `prompt_tokens`: of row_tokens, the prompt's (default two thirds: 400 of 600). `lora`: (slots, rank) of
    the LoRA adapters the engine serves (`lora_engine_kwargs`), None for none."""
    if gpus < 1:
        raise SizingError(f"--gpus must be at least 1, got {gpus}")
    if max_model_len > shape.max_position_embeddings:
        raise SizingError(
            f"max_model_len {max_model_len} is more than {shape.name}'s max_position_embeddings "
            f"{shape.max_position_embeddings}"
        )
    kind = gpu_kind(gpu)
    memory = memory_bytes if memory_bytes is not None else kind.cuda_total_mib * MIB
    candidates = [tensor_parallel_size] if tensor_parallel_size is not None else _tp_candidates(shape, gpus)
    if tensor_parallel_size is not None and (tensor_parallel_size > gpus or shape.heads % tensor_parallel_size):
        raise SizingError(
            f"tensor_parallel_size {tensor_parallel_size} needs {tensor_parallel_size} GPUs that split "
            f"{shape.name}'s {shape.heads} attention heads evenly; the node has {gpus}"
        )
    plans = [
        plan
        for tp in candidates
        if (plan := _size_at(shape, gpu, memory, gpus, tp, gpu_memory_utilization, max_model_len, row_tokens,
                             prompt_tokens, lora))
        is not None
    ]  # fmt: skip
    if not plans:
        raise SizingError(_cannot_fit(shape, gpu, gpus, memory, max_model_len, gpu_memory_utilization, candidates))
    ranked = sorted(plans, key=lambda plan: (-plan.output_tokens_per_s, plan.tensor_parallel_size))
    best = ranked[0]
    if len(ranked) > 1:
        best = best.model_copy(update={"runner_up": _why_slower(best, ranked[1])})
    return best


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
    if not shape.quant_method:
        four_bit = shape.model_copy(update={"weight_bits": 4.25, "quant_method": "awq"})
        if any(
            _size_at(four_bit, gpu, memory, gpus, tp, utilization, max_model_len, DEFAULT_ROW_TOKENS) for tp in tried
        ):
            fixes.append(f"a 4-bit quantized build (AWQ/GPTQ, about {four_bit.weight_bytes() / GIB:.0f} GiB)")
    larger = [
        name
        for name, kind in sorted(gpu_kinds().kinds.items(), key=lambda item: item[1].memory_mib)
        if kind.cuda_total_mib * MIB > memory
        and any(
            _size_at(shape, name, kind.cuda_total_mib * MIB, gpus, tp, utilization, max_model_len, DEFAULT_ROW_TOKENS)
            for tp in _tp_candidates(shape, gpus)
        )
    ]
    if larger:
        fixes.append(f"a larger GPU ({', '.join(larger)} x {gpus})")
    if not fixes:
        fixes.append(
            f"a smaller model or a quantized build: no GPU kind this knows holds it at up to {MAX_TP} GPUs"
            if max_model_len <= 2048
            else f"a shorter max_model_len than {max_model_len}"
        )
    per_gpu = shape.weight_bytes() / GIB / largest
    return (
        f"{shape.name} cannot fit on {gpus} x {gpu}: {shape.weight_bytes() / GIB:.1f} GiB of weights "
        f"({per_gpu:.1f} GiB a GPU at tensor_parallel_size {largest}) leave no room for the KV cache of one "
        f"{max_model_len}-token sequence in {memory / GIB:.1f} GiB x {utilization}; use " + " or ".join(fixes)
    )
