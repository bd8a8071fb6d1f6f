"""Ray Data LLM's tokenizer stages, fetching the model on the node they run on.

Ray Data LLM hands every stage actor the processor's `model_source` and each actor calls Ray's own
`download_model_files` on it. We hand them `model_config` instead and resolve it with
`workload.engine.model_source.resolve_model` in the actor, then give upstream the local folder (for which
`download_model_files` is a no-op). Why not Ray's downloader (ray/llm/_internal/common/utils/download_utils.py,
Ray 2.60): it logs a failed file and carries on, so a model missing a file surfaces later as an unrelated vLLM
error; every actor start that finds the lock free downloads the whole model again (a restarted or rebuilt engine
refetches all its weights); and the driver fetches the tokenizer onto the head. Ours fails with the file's name,
fetches once per node, and never runs on the driver. The engine stage does the same in
`workload.engine.guard.GuardedEngineUDF`.
"""

from __future__ import annotations

from typing import Any

from ray.llm._internal.batch.stages.tokenize_stage import DetokenizeUDF, TokenizeUDF

from workload.contract.config import ModelConfig
from workload.engine.model_source import resolve_model


def local_model(model_config: dict[str, Any]) -> str:
    """This node's folder for the job's model (fetched now if the node lacks it)."""
    return resolve_model(ModelConfig.model_validate(model_config))


class NodeTokenizeUDF(TokenizeUDF):
    def __init__(self, *args: Any, model_config: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "model": local_model(model_config)})


class NodeDetokenizeUDF(DetokenizeUDF):
    def __init__(self, *args: Any, model_config: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "model": local_model(model_config)})
