"""The embed task: the same Ray Data LLM engine stage in vLLM's pooling runner, one vector per text.

What differs from generation, and why it lives here rather than in pipeline.py:
- Ray Data LLM's `task_type="embed"` starts vLLM with `runner="pooling", convert="embed"`
  (ray/llm/_internal/batch/stages/vllm_engine_stage.py, `vLLMEngineWrapper`, Ray 2.60): a causal LM then answers
  with its last token's final hidden state, normalised (vLLM's default pooler for a converted LM, `LAST`), and a
  native embedding model with its own pooler. No chat template, tokenize or detokenize stage: the engine tokenizes
  (one prefill per row, nothing to decode), so the CPU stages would only add actors.
- An OpenAI line may carry several texts (`input` as an array: one vector each, with its index). The row stays one
  row (its position is the unit of exactly-once), and `EmbedEngineUDF` sends each of its texts to the engine as a
  request of its own and joins the vectors, so the crash guard, the hang watchdog and the poison-row bisection
  (workload/engine/guard.py) treat the line as one row, as they treat a row with `n` samples.
- Vectors cross to the driver as float32 bytes (`VECTORS_COLUMN`) with their sizes (`SIZES_COLUMN`): one Arrow
  type for every batch, whatever the size, and no float64 widening on the way.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray.data
from ray.data.llm import build_processor, vLLMEngineProcessorConfig

from workload.contract.config import JobConfig, ModelConfig
from workload.engine.guard import GuardedEngineUDF
from workload.engine.model_source import ModelSourceError, is_hub_id
from workload.engine.pipeline import (
    engine_kwargs,
    fetch_model_on_each_node,
    guard_engine_stage,
    processor_config,
    usage_telemetry_off_when_disabled,
)
from workload.files.embeddings import SIZES_COLUMN, VECTORS_COLUMN, pack_vectors
from workload.files.results import ENGINE_FIRST_REQUEST_COLUMN, ENGINE_RESTARTS_COLUMN
from workload.telemetry import startup_trace

EMBED_COLUMN = "_embed"  # the row's texts and dimensions as JSON (workload/job/input_stream.py)
EMBED_RESULT_COLUMNS = (
    "_pos",
    "id",
    "_passthrough",
    "num_input_tokens",
    "num_generated_tokens",
    "time_taken_llm",
    "batch_uuid",
    ENGINE_RESTARTS_COLUMN,
    ENGINE_FIRST_REQUEST_COLUMN,
    VECTORS_COLUMN,
    SIZES_COLUMN,
)
# Engine arguments that only a generating engine reads: vLLM's pooling runner has no grammar to constrain.
_GENERATION_ONLY = ("structured_outputs_config",)


def embed_processor_config(config: JobConfig, model: ModelConfig) -> vLLMEngineProcessorConfig:
    """The job's processor config (pipeline.processor_config), in the embed task and without the CPU stages."""
    base = processor_config(config, model, seeded=False)
    kwargs = {k: v for k, v in engine_kwargs(config, seeded=False).items() if k not in _GENERATION_ONLY}
    fields = {name: getattr(base, name) for name in type(base).model_fields}
    fields.update(
        task_type="embed",
        engine_kwargs=kwargs,
        chat_template_stage=False,
        tokenize_stage=False,
        detokenize_stage=False,
    )
    return vLLMEngineProcessorConfig(**fields)


class EmbedEngineUDF(GuardedEngineUDF):
    """The guarded engine stage (crash isolation, hang watchdog) answering a row's every text with one vector."""

    def _guard_engine(self) -> None:
        one: Callable[[dict[str, Any]], Any] = self.llm.generate_async  # this engine's own request path

        async def every_text(row: dict[str, Any]) -> Any:
            spec = json.loads(row[EMBED_COLUMN]) if row.get(EMBED_COLUMN) else {"texts": [row["prompt"]]}
            pooling = {"dimensions": spec["dimensions"]} if spec.get("dimensions") is not None else {}
            # Upstream's request builder pops keys off the row it gets: each text gets a copy of its own.
            answers = await asyncio.gather(
                *(one({**row, "prompt": text, "pooling_params": dict(pooling)}) for text in spec["texts"])
            )
            vectors = [np.asarray(data["embeddings"], dtype=np.float32).ravel() for _, data, _ in answers]
            request, first, _ = answers[0]
            joined = {
                **first,
                "embeddings": None,  # upstream's numpy array stays out of Arrow: VECTORS_COLUMN carries it
                "prompt_token_ids": None,
                "num_input_tokens": sum(int(data["num_input_tokens"]) for _, data, _ in answers),
                VECTORS_COLUMN: pack_vectors(vectors),
                SIZES_COLUMN: json.dumps([len(v) for v in vectors]),
            }
            return request, joined, max(taken for _, _, taken in answers)

        self.llm.generate_async = every_text
        super()._guard_engine()

    async def udf(self, batch: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        async for output in super().udf(batch):
            # A failed row (upstream's error row, or the guard's engine_crash) has no vectors: one schema for all.
            output.setdefault(VECTORS_COLUMN, None)
            output.setdefault(SIZES_COLUMN, None)
            output["embeddings"] = None
            yield output


def _keep(columns: tuple[str, ...]) -> Any:
    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {key: row.get(key) for key in columns}

    return postprocess


def build_embed_pipeline(
    dataset: ray.data.Dataset, config: JobConfig, model_path: str | None = None, carry: tuple[str, ...] = ()
) -> ray.data.Dataset:
    """Lazy, as pipeline.build_pipeline: input rows as there (`prompt` the first text, `_embed` every text);
    output rows EMBED_RESULT_COLUMNS and `carry` plus `__inference_error__`."""
    model = config.model if model_path is None else config.model.model_copy(update={"source": model_path})
    stages = config.stages
    with usage_telemetry_off_when_disabled():
        processor = build_processor(
            embed_processor_config(config, model),
            postprocess=_keep(EMBED_RESULT_COLUMNS + carry),
            preprocess_map_kwargs={"num_cpus": stages.num_cpus},
            postprocess_map_kwargs={"num_cpus": stages.num_cpus},
        )
    guard_engine_stage(processor, config, keep_metrics=False)
    object.__setattr__(processor.get_stage_by_name("vLLMEngineStage"), "fn", EmbedEngineUDF)  # see guard_engine_stage
    fetch_model_on_each_node(processor, model)
    answered = processor(dataset)
    startup_trace.mark("pipeline_built")
    return answered


def check_can_embed(model: ModelConfig) -> None:
    """Refuse, before any work, a model vLLM cannot run in its pooling runner, naming the model and the fix.

    vLLM's own judgement, not a list of ours: its model config in the pooling runner (`convert="embed"`) is built
    from the model's config files alone (no weights, no tokenizer); vLLM refuses an architecture it has no model
    or pooling adapter for. The embedded tiny model pools (the suite runs it)."""
    source = model.source
    if source is None:
        return
    from vllm.config import ModelConfig as VllmModelConfig

    staging = None
    where = source
    try:
        if source.startswith("s3://"):
            staging = tempfile.mkdtemp(prefix="llmb-embed-check-")
            where = _config_files_from_s3(source, Path(staging))
        elif not is_hub_id(source) or Path(source).expanduser().exists():
            where = str(Path(source).expanduser())
        VllmModelConfig(model=where, runner="pooling", convert="embed", skip_tokenizer_init=True)
    except Exception as error:
        reason = " ".join(str(error).split())
        if "Value error, " in reason:  # pydantic's wrapping of vLLM's own message
            reason = reason.split("Value error, ", 1)[1]
        raise ModelSourceError(
            f"model.source {source} cannot embed: vLLM cannot run it in its pooling runner ({reason[:300]}). "
            "Use an embedding model or a causal LM vLLM supports, or task: generate"
        ) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _config_files_from_s3(uri: str, target: Path) -> str:
    """The model's config files from s3:// (config.json and a sentence-transformers pooling config), no weights
    and no tokenizer: what vLLM's model config reads."""
    from workload.files.storage import list_files, locate, read_bytes

    root = locate(uri)
    for file in list_files(root):
        relative = file.uri[len(root.uri) :].lstrip("/")
        if relative in _CONFIG_FILES or (relative.endswith("_Pooling/config.json") and relative.count("/") == 1):
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            (target / relative).write_bytes(read_bytes(file))
    return str(target)


_CONFIG_FILES = frozenset(
    {"config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"}
)
