"""The Ray Data LLM pipeline: chat template -> tokenize -> vLLM engine (which decodes the text), from the job config.

The engine is `ray.data.llm`'s vLLM stage: continuous batching inside each replica, with several batches in flight
per replica so the engine never waits for the slowest row of one batch. On GPUs tokenize is Ray's own CPU stage;
the text is decoded once, by vLLM. Every engine of a fixed-size pool starts at once (`processor_config`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pyarrow as pa
import ray.data
from ray.data.llm import Processor, build_processor, vLLMEngineProcessorConfig

from workload import failpoints
from workload.contract.adapter_config import lora_engine_kwargs
from workload.contract.config import JobConfig, ModelConfig
from workload.contract.images import DEFAULT_MAX_IMAGES_PER_ROW
from workload.engine.auto_settings import without_gpu_sizing
from workload.engine.choices import CACHED_COLUMN, CHOICES_COLUMN, FINISH_COLUMN
from workload.engine.feed import Feed, plan_feed
from workload.engine.guard import GuardedEngineUDF
from workload.engine.image_stage import IMAGE_BYTES_COLUMN, ImageFetcher, error_text
from workload.engine.model_source import is_hub_id, model_label
from workload.engine.node_stages import NodeDetokenizeUDF, NodeTokenizeUDF, local_model
from workload.files.images import IMAGES_COLUMN, ImageRefused, ImageRules
from workload.files.results import (
    CHAT_TEMPLATE_PREFIX,
    ENGINE_CALIBRATION_COLUMN,
    ENGINE_FIRST_REQUEST_COLUMN,
    ENGINE_RESTARTS_COLUMN,
)
from workload.files.template_args import TEMPLATE_KWARGS_COLUMN
from workload.files.tools import TOOLS_COLUMN
from workload.telemetry import feed_trace, startup_trace

# Columns the driver needs back; the rest (token ids, prompts) is dropped before it crosses to the driver.
RESULT_COLUMNS = (
    "_pos",
    "id",
    "_max_tokens",
    "_passthrough",
    "generated_text",
    "num_input_tokens",
    "num_generated_tokens",
    "time_taken_llm",
    "batch_uuid",
    ENGINE_RESTARTS_COLUMN,
    ENGINE_FIRST_REQUEST_COLUMN,
    ENGINE_CALIBRATION_COLUMN,
    CHOICES_COLUMN,
    FINISH_COLUMN,
    CACHED_COLUMN,
)
ERROR_COLUMN = "__inference_error__"


class ApplyChatTemplate:
    """CPU stage: rows with `messages` get the model's chat template; rows with `prompt` are sent as written.

    Ray's own ChatTemplateStage needs `messages` in every row and raises out of the stage on the first row the
    template rejects; this job accepts both kinds in one input, and a rejected row becomes that row's error
    (`__inference_error__`, which every later Ray Data LLM stage passes through untouched).
    """

    def __init__(self, model_config: dict[str, Any], image_rules: ImageRules = ImageRules.DEFAULT) -> None:
        from transformers import AutoTokenizer

        self.folder = local_model(model_config)
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.image_rules = image_rules
        self.images: ImageFetcher | None = None  # made at the first image row: a text night never reads the config
        # The tokenize stage adds the tokenizer's special tokens; a template that writes the BOS itself would
        # give chat rows two. Strip the template's copy where the tokenizer adds its own.
        bos = self.tokenizer.bos_token
        adds_bos = bos is not None and self.tokenizer("x").input_ids[:1] == [self.tokenizer.bos_token_id]
        self.strip_bos: str | None = bos if adds_bos else None

    def render(self, messages_json: str, kwargs_json: str | None = None, tools_json: str | None = None) -> str:
        messages = json.loads(messages_json)
        # A row's tools are the template's `tools` argument, as vLLM's server renders them (also under
        # tool_choice "none": vLLM leaves them in unless told to exclude them): workload/files/tools.py.
        tools = json.loads(tools_json)["tools"] if tools_json else None
        # The answer's turn opens after a user's message or a tool's answer (vLLM's server opens it by default).
        add_generation_prompt = messages[-1]["role"] in ("user", "tool")
        text = str(
            self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt,
                # The row's own template variables (enable_thinking, reasoning_effort, ...): workload/files/
                # template_args.py. Validation refused the names this call sets itself.
                **(json.loads(kwargs_json) if kwargs_json else {}),
                **({"tools": tools} if tools else {}),
            )
        )
        if self.strip_bos and text.startswith(self.strip_bos):
            text = text[len(self.strip_bos) :]
        return text

    def __call__(self, batch: pa.Table) -> pa.Table:
        prompts: list[str | None] = []
        errors: list[str] = []
        # A row that already failed (the validation stage's rejected rows) keeps its error and is not rendered.
        earlier = (
            batch.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in batch.column_names else [""] * batch.num_rows
        )
        given = (
            batch.column(TEMPLATE_KWARGS_COLUMN).to_pylist()
            if TEMPLATE_KWARGS_COLUMN in batch.column_names
            else [None] * batch.num_rows
        )
        tools = (
            batch.column(TOOLS_COLUMN).to_pylist() if TOOLS_COLUMN in batch.column_names else [None] * batch.num_rows
        )
        urls = (
            batch.column(IMAGES_COLUMN).to_pylist() if IMAGES_COLUMN in batch.column_names else [None] * batch.num_rows
        )
        chat_kwargs: list[str | None] = []
        fetched: list[list[bytes] | None] = []
        for prompt, messages_json, kwargs_json, tools_json, error, urls_json in zip(
            batch.column("prompt").to_pylist(),
            batch.column("messages_json").to_pylist(),
            given,
            tools,
            earlier,
            urls,
            strict=True,
        ):
            error = error or ""
            images, error = self.fetch_images(urls_json, error)
            fetched.append(images)
            if messages_json is not None and not error:
                try:
                    prompt = self.render(messages_json, kwargs_json, tools_json)
                except Exception as failure:  # jinja's TemplateError, transformers' "no chat template", ...
                    prompt, error = None, f"{CHAT_TEMPLATE_PREFIX}{type(failure).__name__}: {failure}"
            prompts.append(prompt)
            errors.append(error)
            # From here the column marks the chat rows ("{}": the template's defaults), the ones whose answers
            # the engine stage reads for thinking (workload/engine/reasoning.py), as vLLM reads chat answers only.
            chat_kwargs.append((kwargs_json or "{}") if messages_json is not None else None)
        dropped = ("messages_json", ERROR_COLUMN, TEMPLATE_KWARGS_COLUMN, TOOLS_COLUMN, IMAGES_COLUMN)
        batch = batch.drop_columns([c for c in dropped if c in batch.column_names])
        index = batch.schema.get_field_index("prompt")
        batch = batch.set_column(index, "prompt", pa.array(prompts, pa.string()))
        batch = batch.append_column(TEMPLATE_KWARGS_COLUMN, pa.array(chat_kwargs, pa.string()))
        # Kept for the engine stage, which forces and reads the calls (workload/engine/reasoning.py).
        batch = batch.append_column(TOOLS_COLUMN, pa.array(tools, pa.string()))
        batch = batch.append_column(IMAGE_BYTES_COLUMN, pa.array(fetched, pa.list_(pa.binary())))
        return batch.append_column(ERROR_COLUMN, pa.array(errors, pa.string()))

    def fetch_images(self, urls_json: str | None, error: str) -> tuple[list[bytes] | None, str]:
        """A row's images (workload/engine/image_stage.py), or its error; a row that failed earlier keeps its own."""
        if urls_json is None or error:
            return None, error
        if self.images is None:
            self.images = ImageFetcher(self.folder, self.image_rules)
        try:
            return self.images.fetch(urls_json), ""
        except ImageRefused as refused:
            return None, error_text(refused)


def engine_kwargs(config: JobConfig, seeded: bool | None = None, keep_auto: bool = False) -> dict[str, Any]:
    """vLLM's engine arguments. `seeded`: whether any request carries a sampling seed (default: the config's).
    `keep_auto`: leave `auto` settings for the engine actor to size on its GPU (workload/engine/auto_settings.py);
    otherwise, and always on the CPU, they take the values the job ran with before sizing existed."""
    engine = config.engine
    kwargs: dict[str, Any] = {
        "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "enforce_eager": engine.enforce_eager,
        "dtype": engine.dtype,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "seed": engine.seed,
        "load_format": config.model.load_format,
        # Structured answers without free whitespace between JSON tokens (vLLM honours this per engine, not per
        # request, and only with a named backend: xgrammar, what "auto" picks): shorter answers, and a small model
        # cannot pad an object past max_tokens before closing it.
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    # A vision model's engine profiles its encoder with this many images a prompt (vLLM's default: 999), and no row
    # carries more (workload/files/images.py); a text model's engine ignores it. The endpoint's config
    # (workload/contract/serve_config.py) has no input: the default, so its engine stays the job's.
    job_input = getattr(config, "input", None)
    images = job_input.max_images_per_row if job_input is not None else DEFAULT_MAX_IMAGES_PER_ROW
    kwargs["limit_mm_per_prompt"] = {"image": images}
    if config.model.reasoning is not None:
        # Where vLLM 0.32 takes its reasoning parser (`--reasoning-parser` sets this same field): the grammar of a
        # structured output then starts after the thinking ends, and the engine stage splits answers with the same
        # parser (workload/engine/reasoning.py).
        kwargs["structured_outputs_config"]["reasoning_parser"] = config.model.reasoning
    if engine.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = engine.max_num_batched_tokens
    if config.device == "cpu" or not keep_auto:
        kwargs = without_gpu_sizing(kwargs)
    if config.device == "gpu":
        kwargs["gpu_memory_utilization"] = engine.gpu_memory_utilization
    if config.device == "cpu" and (config.sampling.seed is not None if seeded is None else seeded):
        # vLLM's CPU build kills the engine on a seeded request whose prefill is chunked: the model runner rewinds
        # the request's generator (gpu_model_runner.py, _bookkeeping_sync) and CPU generators have no offset.
        # Whether a prefill is chunked depends on what else is queued, so only never chunking is safe.
        # (`config.seeded_cpu_conflict` refuses explicit settings that contradict this.)
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(kwargs.get("max_num_batched_tokens", 0), engine.max_model_len)
    if config.task == "generate":  # adapters answer generation only (an embeddings line naming one is refused)
        # LoRA slots for `model.adapters` (workload/contract/adapter_config.py says why one more on the CPU).
        kwargs.update(lora_engine_kwargs(config.model.adapters, config.device))
    kwargs.update(engine.extra)
    return kwargs


# The engine actor's engine on the CPU, as on one GPU: vLLM's engine-core process runs the model itself.
# vLLM's CPU build otherwise puts the model in a worker process of its own (its multiprocessing executor), and
# inside a Ray actor it must spawn that process (vLLM forces `spawn` there), which imports vLLM a third time; the
# engine core then keeps a core of its own and polls it while the worker computes. Measured on the bimodal
# benchmark (2 cores, one job run each, same machine): engine build 31.0 s -> 17.9 s, peak PSS 4.66 -> 4.28 GiB,
# output tokens/s 1,560 -> 1,664, CPU seconds of the engine's processes 86 -> 49 (docs/benchmark.md). vLLM reads
# the variable for this alone (its asynchronous engine, which the engine stage runs, keeps its engine-core
# process). Tensor parallelism, which would need the worker processes, is refused on the CPU
# (workload/contract/config.py).
CPU_ONE_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def engine_env(config: JobConfig) -> dict[str, str]:
    env: dict[str, str] = {}
    if not is_hub_id(config.model.source):
        # vLLM and transformers load the folder each actor fetched (workload/engine/node_stages.py); no hub lookups.
        # A hub id is fetched by the actors themselves, so they keep the node's own hub settings.
        env["HF_HUB_OFFLINE"] = "1"
    if config.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.engine.cpu_kvcache_space_gib)
        env.update(CPU_ONE_PROCESS_ENGINE)
    # Set by a test or the benchmark, they must reach the engine actors: an injected engine crash
    # (failpoints.ENGINE_CRASH_ON_ROW), the start-up marks of the engine's build
    # (workload/telemetry/startup_trace.py) and the feed's samples (workload/telemetry/feed_trace.py).
    for variable in (failpoints.VARIABLE, startup_trace.VARIABLE, feed_trace.VARIABLE):
        value = os.environ.get(variable)
        if value:
            env[variable] = value
    return env


def engine_feed(config: JobConfig) -> Feed:
    """Rows in flight per engine (workload/engine/feed.py), bounded by this driver's memory."""
    return plan_feed(config, psutil.virtual_memory().total)


def processor_config(
    config: JobConfig, model: ModelConfig, seeded: bool | None = None, feed: Feed | None = None
) -> vLLMEngineProcessorConfig:
    """Ray Data LLM's config; `model_source` is only a label here: each stage actor fetches `model` on its own
    node (`fetch_model_on_each_node`), so the driver never downloads anything."""
    stages = config.stages
    cpu_stage = {
        "enabled": config.tokenizer_stages,
        "num_cpus": stages.num_cpus,
        "concurrency": cpu_stage_actors(config),
        "batch_size": stages.batch_size,
    }
    # A pair, never a bare int: Ray Data LLM turns an int n into an autoscaling pool of 1..n engines, so on a
    # fixed-size cluster the second GPU got its engine only after the first was up. (n, n) starts all n at once;
    # with max_replicas, `replicas` start at once and the rest as nodes come.
    concurrency = (config.replicas, config.max_replicas or config.replicas)
    feed = feed or engine_feed(config)
    return vLLMEngineProcessorConfig(
        model_source=model_label(model),
        engine_kwargs=engine_kwargs(config, seeded, keep_auto=True),
        batch_size=config.batch_size,
        max_concurrent_batches=feed.batches,
        # The engine's own queue takes every row in flight. Ray's default (1.1x max_num_seqs) left a step that
        # ended many rows at once with few queued behind them: the next ones were still waiting on Ray's
        # semaphore, not in vLLM's scheduler, and the freed slots stayed empty for a step or more.
        max_pending_requests=feed.rows_in_flight,
        concurrency=concurrency,
        # On the CPU the engine actor must not ask Ray for a GPU it will never get.
        placement_group_config={"bundles": [{"CPU": 1}]} if config.device == "cpu" else None,
        runtime_env={"env_vars": engine_env(config)},
        should_continue_on_error=True,
        # Ray's Prometheus exporter, which nothing scrapes here; the engine's stats reach CloudWatch from the
        # guard instead (workload/telemetry/engine_stats.py).
        log_engine_metrics=False,
        chat_template_stage=False,
        tokenize_stage=cpu_stage,
        # Text is decoded once, by vLLM (which must decode anyway to match stop strings); Ray's detokenize stage
        # decoded the same tokens a second time, in one more actor the engines' output waited on.
        detokenize_stage=False,
    )


def cpu_stage_actors(config: JobConfig) -> int:
    """Actors per CPU stage: the config's, but on GPUs at least two once there are two engines, so a lost
    CPU-stage actor (its node gone) leaves the other feeding every engine while Ray restarts it
    (`spread_cpu_stages`). On the CPU the engines' own cores would pay for the second one."""
    if config.device == "gpu":
        return max(config.stages.concurrency, min(2, config.replicas))
    return config.stages.concurrency


def spread_cpu_stages(processor: Processor) -> None:
    """The tokenize stage's actors on different nodes where the cluster has them (Ray's SPREAD), not all on one."""
    for name in ("TokenizeStage",):
        try:
            processor.get_stage_by_name(name).map_batches_kwargs["scheduling_strategy"] = "SPREAD"
        except ValueError:  # the stage is off
            continue


def guard_engine_stage(processor: Processor, config: JobConfig, keep_metrics: bool = True) -> None:
    """Swap in our crash-isolating engine UDF and bound Ray's own restarts (see workload/engine/guard.py for the
    upstream code this works around: os._exit(1) on a fatal engine error, max_restarts=-1, max_task_retries=-1)."""
    stage = processor.get_stage_by_name("vLLMEngineStage")
    # Not `stage.fn = ...`: the stage validates assignments, and re-running its validator (which has already
    # popped placement_group_config) would ask Ray for a GPU.
    object.__setattr__(stage, "fn", GuardedEngineUDF)
    stage.fn_constructor_kwargs.update(
        crash_retries=config.engine.crash_retries,
        hang_timeout_s=config.engine.hang_timeout_s,
        max_consecutive_crashes=config.engine.max_consecutive_crashes,
        keep_metrics=keep_metrics,
        row_tokens=config.engine.row_tokens,
        metrics=config.metrics.model_dump(mode="json"),
    )
    # Ray's knobs, passed by Ray Data to the actor's options (map_batches' ray_remote_args). Restarts are bounded:
    # an actor killed over and over (a batch that runs it out of memory) stops the run. Its batches' retries are
    # not: a batch of a lost node waits for the restarted actor, and Ray spends a retry each time it finds the
    # actor unreachable or still restarting (a new node and an engine start: minutes), so any finite budget
    # fails the run on a lost node (seen with 3). An actor out of restarts fails its batches at once.
    stage.map_batches_kwargs.update(max_restarts=config.engine.max_actor_restarts, max_task_retries=-1)


def fetch_model_on_each_node(processor: Processor, model: ModelConfig) -> None:
    """Every stage that loads the model gets its config and fetches the model on its own node
    (workload/engine/node_stages.py); the engine's UDF is swapped by `guard_engine_stage`."""
    config = model.model_dump(mode="json")
    for name, udf in (("TokenizeStage", NodeTokenizeUDF), ("DetokenizeStage", NodeDetokenizeUDF)):
        try:
            stage = processor.get_stage_by_name(name)
        except ValueError:  # the stage is turned off (JobConfig.tokenizer_stages)
            continue
        object.__setattr__(stage, "fn", udf)  # not `stage.fn = `: see guard_engine_stage
        stage.fn_constructor_kwargs["model_config"] = config
    processor.get_stage_by_name("vLLMEngineStage").fn_constructor_kwargs["model_config"] = config


class _NoTelemetry:
    def push_telemetry_report(self, telemetry: Any) -> None:
        pass


@contextmanager
def usage_telemetry_off_when_disabled() -> Iterator[None]:
    """With Ray's usage stats turned off (RAY_USAGE_STATS_ENABLED=0, which every tier sets:
    workload/contract/entrypoint.py),
    build the processor without its usage-telemetry actor.

    Ray Data LLM's `build_processor` starts a named `_TelemetryAgent` actor and waits on it
    (ray/llm/_internal/batch/processor/vllm_engine_proc.py, Ray 2.60), whatever the usage-stats setting: on 2
    cores that put a Ray worker's start on the job's path to its first token, and the actor then held 126 MiB for
    the whole run, to record tags that a cluster with usage stats off never sends.
    """
    from ray._common.usage.usage_lib import usage_stats_enabled
    from ray.llm._internal.batch.processor import vllm_engine_proc

    if usage_stats_enabled():
        yield
        return
    upstream = vllm_engine_proc.get_or_create_telemetry_agent
    vllm_engine_proc.get_or_create_telemetry_agent = _NoTelemetry
    try:
        yield
    finally:
        vllm_engine_proc.get_or_create_telemetry_agent = upstream


def _keep(columns: tuple[str, ...]) -> Any:
    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {key: row.get(key) for key in columns}

    return postprocess


def engine_input(
    positions: list[int],
    prompts: list[str | None],
    messages: list[list[dict[str, str]] | None],
    sampling: list[dict[str, Any]],
    ids: list[str] | None = None,
) -> pa.Table:
    """The pipeline's input columns (see `build_pipeline`); the job and the benchmark both build them here."""
    return pa.table(
        {
            "_pos": pa.array(positions, pa.int64()),
            "id": pa.array(ids if ids is not None else [str(p) for p in positions], pa.string()),
            "prompt": pa.array(prompts, pa.string()),
            "messages_json": pa.array([None if m is None else json.dumps(m) for m in messages], pa.string()),
            "sampling_params": pa.array(sampling),
        }
    )


def input_blocks(table: pa.Table, batch_size: int) -> list[pa.Table]:
    """The engine input cut into blocks of four batches, so the CPU stages and the engine overlap; one big block
    would serialise them, and one-row blocks would drown the scheduler in tiny tasks."""
    block_rows = max(batch_size, 1) * 4
    return [table.slice(start, block_rows) for start in range(0, table.num_rows, block_rows)]


def engine_batches(
    dataset: ray.data.Dataset, config: JobConfig, model_config: dict[str, Any], chat_template: bool
) -> ray.data.Dataset:
    """The rows as the engine stage takes them (lazy, no Ray needed): chat rows templated, one block per batch.

    Every operator added here asks Ray for the CPU stages' `num_cpus`, never Ray Data's default of one CPU a task:
    see `one_batch_per_block`."""
    stages = config.stages
    templated = dataset
    if chat_template:
        templated = dataset.map_batches(
            ApplyChatTemplate,
            fn_constructor_kwargs={"model_config": model_config, "image_rules": ImageRules.of(config.input)},
            batch_size=stages.batch_size,
            num_cpus=stages.num_cpus,
            compute=ray.data.ActorPoolStrategy(size=cpu_stage_actors(config)),
            scheduling_strategy="SPREAD",
            batch_format="pyarrow",
        )
    # One block per batch: Ray Data runs an actor task per block, and inside it up to 4 of the block's batches at
    # once (ray/data/_internal/planner/plan_udf_map_op.py, DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY), so rows in
    # flight depended on how the read cut its blocks. With one batch a block, the engine actor runs exactly
    # `feed.batches` batches (its max_concurrency) and the feed is the line's number.
    return one_batch_per_block(templated, config.batch_size, stages.num_cpus)


def one_batch_per_block(dataset: ray.data.Dataset, rows: int, num_cpus: float) -> ray.data.Dataset:
    """`dataset` cut into blocks of `rows` (Ray Data's streaming repartition), its tasks asking `num_cpus` each.

    Why the CPUs: `Dataset.repartition` takes no Ray options, so its tasks asked Ray Data's default for a map task,
    one whole CPU (ray/data/_internal/execution/operators/map_operator.py, `_canonicalize_ray_remote_args`, Ray
    2.60). On a 2-CPU node whose engine bundle holds the other CPU, each repartition task took all that was left,
    in Ray and in Ray Data's CPU budget: the tasks ran one at a time and, while one ran, the 0.1-CPU stages after
    it (Ray Data LLM's pre- and post-processing maps) got a budget of 0-0.1 CPU, so the engine got its first
    batches in a trickle and its answers queued unread (docs/benchmark.md, "Against `vllm run-batch`", read from
    Ray Data's own execution log). The repartition only re-slices blocks: the stages' share is plenty."""
    from ray.data._internal.logical.operators import StreamingRepartition

    cut = dataset.repartition(target_num_rows_per_block=rows)
    # The one way in: the operator Ray just planned. A Ray that plans something else fails here, by name, rather
    # than running its tasks at one CPU each again.
    operator = cut._logical_plan.dag
    if not isinstance(operator, StreamingRepartition):
        raise TypeError(f"Ray Data planned {type(operator).__name__} for a repartition, not StreamingRepartition")
    operator.ray_remote_args["num_cpus"] = num_cpus
    return cut


def build_pipeline(
    dataset: ray.data.Dataset,
    config: JobConfig,
    model_path: str | None = None,
    keep_metrics: bool = False,
    chat_template: bool = True,
    seeded: bool | None = None,
    carry: tuple[str, ...] = (),
) -> ray.data.Dataset:
    """Lazy: nothing runs until the returned dataset is iterated.

    Input rows: `_pos`, `id`, `prompt` (or None), `messages_json` (or None), `sampling_params`; the job's rows
    also carry the validation stage's columns (workload/job/input_stream.py), and a row whose `__inference_error__` is
    already set passes every stage untouched and comes back with all its columns.
    Output rows: RESULT_COLUMNS plus `__inference_error__` (empty unless the row failed), and `metrics`
    (vLLM's per-request timings) when keep_metrics is set. With chat_template False (no row has `messages`)
    the chat-template stage, its actor and its tokenizer are left out. `carry`: input columns the output keeps
    too (a pool's member tag, workload/job/pool.py).

    The model: each actor fetches `config.model` on its own node; `model_path` instead names a folder that is
    already on every node (the benchmark's one-node runs).
    """
    stages = config.stages
    model = config.model if model_path is None else config.model.model_copy(update={"source": model_path})
    templated = engine_batches(dataset, config, model.model_dump(mode="json"), chat_template)
    columns = RESULT_COLUMNS + (("metrics",) if keep_metrics else ()) + carry
    feed = engine_feed(config)
    print(feed.line(), flush=True)
    with usage_telemetry_off_when_disabled():
        processor = build_processor(
            processor_config(config, model, seeded, feed),
            postprocess=_keep(columns),
            preprocess_map_kwargs={"num_cpus": stages.num_cpus},
            postprocess_map_kwargs={"num_cpus": stages.num_cpus},
        )
    guard_engine_stage(processor, config, keep_metrics)
    fetch_model_on_each_node(processor, model)
    spread_cpu_stages(processor)
    answered = processor(templated)
    startup_trace.mark("pipeline_built")
    return answered
