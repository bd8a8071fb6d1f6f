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
from pathlib import Path
from typing import Any

from workload.contract.config import UNSIZED_MAX_NUM_SEQS
from workload.contract.engine_sizing import (
    DTYPE_BYTES,
    EnginePlan,
    ModelShape,
    SizingError,
    plan_engine,
    read_model_config,
)
from workload.engine.model_source import ModelSourceError, is_hub_id
from workload.files.storage import StorageError, locate, read_bytes

AUTO = "auto"
AUTO_KEYS = ("max_num_seqs", "max_num_batched_tokens")


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


def kind_of_gpu_name(name: str) -> str:
    """The gpu_kinds.json kind of an NVML device name ("NVIDIA A10G", "NVIDIA A100-SXM4-40GB", ...)."""
    lowered = name.lower()
    for needle, kind in (
        ("a10g", "a10g"),
        ("l4", "l4"),
        ("h100", "h100"),
        ("80gb", "a100-80gb"),
        ("a100", "a100-40gb"),
    ):
        if needle in lowered:
            return kind
    return "a10g"  # the smallest of the table: a GPU it does not know is sized as if it had 24 GB


def without_gpu_sizing(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`auto` where no GPU sizes it (the CPU, the serve and bench paths): max_num_seqs 128, the step budget vLLM's.
    On the CPU, vLLM's KV cache is `VLLM_CPU_KVCACHE_SPACE`, not the device's memory, and the CPU tests and
    benchmarks were tuned at these values."""
    settled = dict(engine_kwargs)
    if settled.get("max_num_seqs") == AUTO:
        settled["max_num_seqs"] = UNSIZED_MAX_NUM_SEQS
    if settled.get("max_num_batched_tokens") == AUTO:
        del settled["max_num_batched_tokens"]
    return settled


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
    # Sized from what is free at the same share vLLM takes of the total: a little under vLLM's own figure (the
    # CUDA context, counted out of the free memory, is counted again in RESERVE_GIB), never over it.
    try:
        plan = plan_engine(
            shape,
            kind_of_gpu_name(name),
            int(settled.get("tensor_parallel_size", 1)),
            max_model_len=int(settled["max_model_len"]),
            gpu_memory_utilization=float(settled.get("gpu_memory_utilization", 0.9)),
            row_tokens=row_tokens,
            tensor_parallel_size=int(settled.get("tensor_parallel_size", 1)),
            memory_bytes=free,
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
