"""Each line's LoRA adapter, by the name its `model` gives (issue 57): the engine stage's routing.

Why not Ray Data LLM's own: its engine stage (ray/llm/_internal/batch/stages/vllm_engine_stage.py,
`_maybe_get_lora_request`, Ray 2.60) treats any row whose `model` differs from the base as an adapter to download,
by that name, from one `dynamic_lora_loading_path`, on first use, in the middle of the night's batches; a name
nobody configured becomes a download attempt. Here the adapters are the config's (`model.adapters`), each fetched
once per node before the engine starts (workload/engine/model_source.py, as the base model is), its rank checked
against the config, and a row names its adapter in its own column (`ADAPTER_COLUMN`), set only for names the
config lists: the OpenAI reader refused every other name as `model_not_found` (workload/files/openai_batch.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workload.contract.config import ModelConfig
from workload.engine.model_source import ModelSourceError, check_folder, resolve_folder
from workload.files.openai_batch import ADAPTER_COLUMN

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _what(name: str) -> str:
    return f"model.adapters.{name}.source"


def _checked_rank(name: str, folder: str, rank: int) -> None:
    """The folder's PEFT rank is the config's: engine-plan sized the LoRA slots by the config's."""
    try:
        found = json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("r")
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"{_what(name)}: cannot read its {ADAPTER_CONFIG}: {error}") from error
    if found != rank:
        raise ModelSourceError(
            f"model.adapters.{name}: its {ADAPTER_CONFIG} says rank (r) {found!r}, the config says {rank}: "
            f"set model.adapters.{name}.rank to the adapter's own"
        )


def _checked_weights(name: str, folder: str, rank: int) -> None:
    """The weights file reads, and its LoRA A and B are of the rank: checked before the engine loads them, because
    vLLM 0.32 on the CPU died of `Illegal instruction` (the whole actor with it) when a request named an adapter
    whose weights file was unreadable (seen here 2026-12-07; its `add_lora` raised, a request crashed)."""
    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        if (Path(folder) / "adapter_model.bin").is_file():
            return  # PEFT's older pickle format, which vLLM also loads; not opened here (it would run pickle)
        raise ModelSourceError(f"{_what(name)}: no {ADAPTER_WEIGHTS} (PEFT's weights file) in {folder}")
    from safetensors import safe_open

    try:
        with safe_open(str(path), "numpy") as weights:
            # safe_open's handle lists its tensors by keys() and is not iterable itself.
            shapes = {key: weights.get_slice(key).get_shape() for key in weights.keys()}  # noqa: SIM118
    except Exception as error:  # safetensors' own error type for a bad header or a truncated file
        raise ModelSourceError(f"{_what(name)}: {ADAPTER_WEIGHTS} cannot be read: {error}") from None
    pairs = [key for key in shapes if ".lora_A." in key]
    if not pairs:
        raise ModelSourceError(f"{_what(name)}: {ADAPTER_WEIGHTS} holds no LoRA weights (no lora_A tensors)")
    wrong = sorted(
        key
        for key, shape in shapes.items()
        if (".lora_A." in key and shape[0] != rank) or (".lora_B." in key and shape[-1] != rank)
    )
    if wrong:
        raise ModelSourceError(f"model.adapters.{name}: {wrong[0]} is not of rank {rank}: {shapes[wrong[0]]}")


def adapter_folders(model: ModelConfig) -> dict[str, str]:
    """This node's folder for every adapter of `model`, fetched now where the node lacks it; ranks and weights
    checked."""
    folders = {}
    for name, adapter in sorted(model.adapters.items()):
        folder = resolve_folder(adapter.source, model.cache_dir, ADAPTER_CONFIG, _what(name))
        _checked_rank(name, folder, adapter.rank)
        _checked_weights(name, folder, adapter.rank)
        folders[name] = folder
    return folders


def check_adapters(model: ModelConfig) -> None:
    """Refuse an adapter source that cannot be one, without fetching it (for the process that plans the work)."""
    for name, adapter in sorted(model.adapters.items()):
        check_folder(adapter.source, ADAPTER_CONFIG, _what(name))


class AdapterRoutes:
    """The LoRA request of each adapter this engine serves; ids from 1 (vLLM's 0 is no adapter), stable by name."""

    def __init__(self, folders: dict[str, str]) -> None:
        from vllm.lora.request import LoRARequest

        self.requests = {
            name: LoRARequest(lora_name=name, lora_int_id=index, lora_path=folder)
            for index, (name, folder) in enumerate(sorted(folders.items()), start=1)
        }

    def request_for(self, row: dict[str, Any]) -> Any:
        """The row's LoRA request, or None for the base model. A name the engine does not serve fails the row."""
        name = row.get(ADAPTER_COLUMN)
        if not name:
            return None
        request = self.requests.get(name)
        if request is None:  # only a config changed between validation and the engine could do this
            raise ValueError(f"model {name!r} is not an adapter of this engine (served: {sorted(self.requests)})")
        return request
