"""Engine settings whose value is `auto`, decided where the engine starts: from the model's real `config.json` and
the GPU's real free memory, with the one sizing function the plan and `engine-plan` use
(workload/contract/engine_sizing.py).

What is decided when: the engine's arguments depend on the model, the GPU and the config only, so they are known
before the id pass reads the input and every engine is started with them at once. Two things do wait for the id
pass: whether any row carries a sampling seed (on the CPU it turns chunked prefill off: pipeline.engine_kwargs)
and whether any row has `messages` (the chat-template stage); neither changes what `auto` resolves to.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from workload.contract.config import UNSIZED_MAX_NUM_SEQS
from workload.contract.engine_sizing import (
    DTYPE_BYTES,
    MIB,
    EnginePlan,
    ModelShape,
    SizingError,
    gpu_kind,
    plan_engine,
    read_model_config,
)
from workload.engine.model_source import ModelSourceError, is_hub_id
from workload.files.storage import StorageError, locate, read_bytes

AUTO = "auto"
AUTO_KEYS = ("max_num_seqs", "max_num_batched_tokens")
# What vLLM's EngineArgs give a setting left unset where there is no usage context, as in Ray Data LLM's stage.
VLLM_UNSET_MAX_NUM_SEQS = 128
VLLM_UNSET_BATCHED_TOKENS = 2048


def model_config_json(source: str, cache_dir: str | None = None) -> dict[str, Any]:
    """A model's config.json from a folder, an s3:// prefix (one GET, no weights) or a hub id (the hub's cache
    first, then one download of that file)."""
    if source.startswith("s3://"):
        try:
            data = read_bytes(locate(source.rstrip("/") + "/config.json"))
        except StorageError as error:
            raise SizingError(f"{source}: cannot read its config.json ({error})") from None
        return dict(json.loads(data))
    if Path(source).expanduser().exists() or not is_hub_id(source):
        return read_model_config(source)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return read_model_config(Path(hf_hub_download(source, "config.json", cache_dir=cache_dir)).parent)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ModelSourceError) as error:
        raise SizingError(f"{source}: cannot get its config.json from the Hugging Face hub ({error})") from None


def free_gpu_memory() -> tuple[int, str] | None:
    """The first visible GPU's free memory in bytes and its name (NVML, which needs no CUDA context), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: the CPU path
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free), name if isinstance(name, str) else name.decode()
    finally:
        pynvml.nvmlShutdown()


def kind_of_gpu_name(name: str) -> str | None:
    """The gpu_kinds.json kind of an NVML device name ("NVIDIA A10G", "NVIDIA A100-SXM4-40GB", "NVIDIA H200", ...),
    or None for a GPU the table does not know (an L40S is not an L4, an H200 not an A10G)."""
    lowered = name.lower().replace("nvidia", " ")
    for pattern, kind in (
        (r"\bh200\b", "h200"),
        (r"\bh100\b", "h100"),
        (r"\ba100\b.*80\s*gb", "a100-80gb"),
        (r"\ba100\b", "a100-40gb"),
        (r"\ba10g\b", "a10g"),
        (r"\bl4\b", "l4"),
    ):
        if re.search(pattern, lowered):
            return kind
    return None


def without_gpu_sizing(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`auto` where no GPU sizes it (the CPU, the serve and bench paths): max_num_seqs 128, the step budget left to
    vLLM, which inside Ray Data LLM means 2,048 tokens: its stage builds the engine with `create_engine_config()` and
    no usage context, so vLLM's per-GPU defaults for its `LLM` class (up to 1,024 sequences and 16,384 tokens on an
    H100) never apply. On the CPU, vLLM's KV cache is `VLLM_CPU_KVCACHE_SPACE`, not the device's memory, and the
    CPU tests and benchmarks were tuned at these values."""
    settled = dict(engine_kwargs)
    if settled.get("max_num_seqs") == AUTO:
        settled["max_num_seqs"] = UNSIZED_MAX_NUM_SEQS
    if settled.get("max_num_batched_tokens") == AUTO:
        del settled["max_num_batched_tokens"]
    return settled


def settled_summary(engine_kwargs: dict[str, Any]) -> str:
    """The settings the engine starts with, as one line; a key left out is vLLM's default inside Ray Data LLM."""
    seqs = engine_kwargs.get("max_num_seqs", VLLM_UNSET_MAX_NUM_SEQS)
    batched = engine_kwargs.get("max_num_batched_tokens")
    shown = f"{batched}" if batched is not None else f"vLLM's {VLLM_UNSET_BATCHED_TOKENS} (left to it)"
    return (
        f"max_num_seqs {seqs}, max_num_batched_tokens {shown}, tensor_parallel_size "
        f"{engine_kwargs.get('tensor_parallel_size', 1)}, max_model_len {engine_kwargs.get('max_model_len')}, "
        f"gpu_memory_utilization {engine_kwargs.get('gpu_memory_utilization', 0.9)}"
    )


def settle(
    engine_kwargs: dict[str, Any], model_dir: str, row_tokens: int, gpu: tuple[int, str] | None = None
) -> tuple[dict[str, Any], EnginePlan | None]:
    """engine_kwargs with every `auto` value decided; the plan it came from (None where no GPU is visible, or
    with none auto). `gpu`: (free bytes, device name) to size for; default measured here."""
    wanted = [key for key in AUTO_KEYS if engine_kwargs.get(key) == AUTO]
    if not wanted:
        return engine_kwargs, None
    gpu = gpu or free_gpu_memory()
    if gpu is None:
        return without_gpu_sizing(engine_kwargs), None
    settled = dict(engine_kwargs)
    free, name = gpu
    config = read_model_config(model_dir)
    shape = ModelShape.from_config(config, Path(model_dir).name)
    dtype = str(settled.get("dtype") or AUTO)
    if dtype in DTYPE_BYTES:
        shape = shape.model_copy(update={"dtype": dtype})
    # vLLM takes its share of what CUDA reports as the total; sized from that where the kind is known and from the
    # free memory where that is less (another process on the GPU) or the kind unknown (sized as an A10G's speed).
    kind = kind_of_gpu_name(name)
    if kind is None:
        print(f"[llm-batch] engine sizing: {name!r} is no kind of gpu_kinds.json; sized from its free memory")
    else:
        free = min(free, gpu_kind(kind).cuda_total_mib * MIB)
    try:
        plan = plan_engine(
            shape,
            kind or "a10g",
            int(settled.get("tensor_parallel_size", 1)),
            max_model_len=int(settled["max_model_len"]),
            gpu_memory_utilization=float(settled.get("gpu_memory_utilization", 0.9)),
            row_tokens=row_tokens,
            tensor_parallel_size=int(settled.get("tensor_parallel_size", 1)),
            memory_bytes=free,
            # The LoRA slots' buffers (model.adapters) come out of the KV cache's memory, as vLLM's profile finds.
            lora=(int(settled["max_loras"]), int(settled["max_lora_rank"])) if settled.get("enable_lora") else None,
        )
    except SizingError as error:
        # The estimate errs on the small side; vLLM's own profile decides (and refuses a cache that cannot hold
        # one max_model_len sequence, with its own message). The plan and preflight refused such a stack already.
        print(f"[llm-batch] engine sizing: {error}; starting with vLLM's defaults", flush=True)
        return without_gpu_sizing(engine_kwargs), None
    for key in wanted:
        settled[key] = getattr(plan, key)
    if not settled.get("enable_chunked_prefill", True):
        # Without chunked prefill every prompt prefills in one step: the budget must hold the longest.
        settled["max_num_batched_tokens"] = max(int(settled["max_num_batched_tokens"]), int(settled["max_model_len"]))
    return settled, plan


CALIBRATION_LINE = "[llm-batch] engine calibration: "


def calibration_record(plan: EnginePlan, vllm_config: Any, gpu_name: str) -> dict[str, Any]:
    """vLLM's own KV-cache size beside the plan's, once the engine has profiled and allocated it: one JSON line
    in the engine's log, which `python -m workload engine-calibration` reads back."""
    cache = vllm_config.cache_config
    return {
        "model": plan.model,
        "gpu": plan.gpu,
        "gpu_name": gpu_name,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "max_num_batched_tokens": int(vllm_config.scheduler_config.max_num_batched_tokens),
        "max_num_seqs": int(vllm_config.scheduler_config.max_num_seqs),
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "plan_kv_cache_tokens": plan.kv_cache_tokens,
        "vllm_kv_cache_tokens": int(cache.num_gpu_blocks) * int(cache.block_size),
    }
