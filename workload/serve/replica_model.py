"""The endpoint's model, fetched by each engine replica on its own node, as the batch job's stage actors do.

Serve builds the application where the app builder runs (the RayService's head, or the `python -m workload serve`
process); the engine replicas run on GPU worker nodes, each with its own disk. So the builder hands Ray Serve LLM
only a label for the model (`workload.engine.model_source.model_label`: the folder every node will hold it in, or the
hub
id), and this callback resolves `config.model` with `workload.engine.model_source.resolve_model` inside the replica,
before its engine starts: once per node under a file lock, s3:// through boto3's transfer manager, a hub id with
the node's token file (`HF_TOKEN_PATH`), never a token in the environment or the logs.

The hook is Ray Serve LLM's `LLMConfig.callback_config` (Ray 2.60, `VLLMEngine.start`): `on_before_node_init` runs
in the replica's process and points the engine at the folder it resolved; Ray's node initialisation then runs
`on_before_download_model_files_distributed` on every node of the replica's placement group (the nodes its engine
workers use), which resolves the model there too (a no-op where the folder is already whole). Ray's own
downloader then finds a local folder and fetches nothing (`download_model_files` returns a path that is not a
cloud URI unchanged). Why not Ray's downloader: see workload/engine/node_stages.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase

from workload.contract.config import ModelConfig
from workload.engine.model_source import resolve_model

# The kwarg under which the callback gets the endpoint's `model` section (a ModelConfig as plain data).
MODEL_CONFIG = "model_config"


def callback_config(model: ModelConfig) -> dict[str, Any]:
    """`LLMConfig.callback_config` for a replica that fetches `model` itself; plain data (the class by its
    path, which Serve LLM loads in the replica), so the LLMConfig fields stay printable (the benchmark records
    them)."""
    return {
        "callback_class": f"{__name__}:FetchModelOnNode",
        "callback_kwargs": {MODEL_CONFIG: model.model_dump(mode="json")},
    }


def _resolve(model_config: dict[str, Any]) -> str:
    return resolve_model(ModelConfig.model_validate(model_config))


class FetchModelOnNode(CallbackBase):
    """Resolves the endpoint's model on the replica's node (and on each node of its placement group)."""

    async def on_before_node_init(self) -> None:
        # In a thread: a download of many GiB must not stall the replica's event loop.
        local = await asyncio.to_thread(_resolve, self.kwargs[MODEL_CONFIG])
        # What vLLM loads (`model=` is the engine config's `actual_hf_model_id`): this node's folder.
        self.llm_config.get_engine_config().hf_model_id = local

    def on_before_download_model_files_distributed(self) -> None:
        _resolve(self.kwargs[MODEL_CONFIG])
