"""The job's one typed configuration: CLI, container and cluster all load this model.

It imports neither Ray nor vLLM, so the Pulumi program can build and render it (`infra` may import this
module, never the job itself).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workload.contract.adapter_config import AdapterModel
from workload.contract.image_files import IMAGE_FILE_FIELDS, ImageFileSettings
from workload.contract.images import IMAGE_FIELDS, ImageInputSettings
from workload.contract.metric_names import ALARM_PERIOD_S
from workload.contract.model_parsers import ParserModel
from workload.contract.parser_choice import AUTO

DEFAULT_METRICS_NAMESPACE = "RayDataLLM/BatchInference"
# max_num_seqs where `auto` is not sized (the CPU, the serve and bench paths): the fixed value of before sizing.
UNSIZED_MAX_NUM_SEQS = 128


class _Strict(BaseModel):
    # A typo in a config key must stop the run, not be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputConfig(ImageInputSettings, ImageFileSettings, _Strict):
    uri: str = Field(description="Local file or folder, or s3://bucket/prefix, holding the prompts.")
    format: Literal["auto", "jsonl", "parquet", "openai"] = Field(
        "auto",
        description="Input format; 'auto' decides from each file's extension (.jsonl/.json, .parquet), and reads "
        "JSONL whose first line is an OpenAI Batch request (`custom_id`, `url`, `body`) as one; 'openai' says so.",
    )
    openai_url: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"] | None = Field(
        None,
        description="The url of an OpenAI Batch input (one per batch); None: the first request line's url. "
        "/v1/embeddings runs the embed task; /v1/responses is answered as chat.",
    )
    max_record_bytes: int = Field(
        16 << 20,
        ge=1024,
        le=256 << 20,
        description="Largest record: a JSONL line, or a Parquet row's serialised size. A larger one is a "
        "`record_too_large` error row, never read whole (a 1 GB line must not end a night by memory).",
    )

    @field_validator("uri")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input.uri is empty")
        return value


class OutputConfig(_Strict):
    uri: str = Field(description="Local folder or s3://bucket/prefix for results/, errors/ and summary.json.")
    shard_rows: int = Field(
        1000,
        ge=1,
        description="Rows per committed shard: the unit of exactly-once commit and of resume. "
        "Smaller loses less work to an interruption; larger writes fewer files.",
    )

    @field_validator("uri")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("output.uri is empty")
        return value


class ModelConfig(_Strict, AdapterModel, ParserModel):
    source: str | None = Field(
        None,
        description="Local path, s3:// prefix or Hugging Face hub id. None: the embedded tiny model "
        "the job creates and caches itself (random weights, for demos and tests).",
    )
    load_format: Literal["auto", "dummy", "safetensors", "pt"] = Field(
        "auto", description="vLLM load_format; 'dummy' gives a real architecture random weights (benchmarks)."
    )
    cache_dir: str = Field(
        "~/.cache/llm-batch/models", description="Where downloaded (s3://) and generated models are kept."
    )
    name: str = Field(
        "llm-batch",
        min_length=1,
        description="The model's one name, in OpenAI Batch output bodies and requests (the endpoint's too).",
    )
    aliases: list[str] = Field(
        default_factory=list,
        description="Other names OpenAI Batch requests may give as `model` (e.g. gpt-4o-mini for a team moving "
        "off OpenAI): answered by this model, reported under `name`.",
    )

    def names(self) -> frozenset[str]:
        return frozenset({self.name, *self.aliases})


class EngineConfig(_Strict):
    max_model_len: int = Field(2048, ge=16, description="Longest prompt + output, in tokens.")
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0, description="vLLM's share of GPU memory.")
    max_num_seqs: int | str = Field(
        "auto",
        description="Sequences decoded at once by each engine. 'auto': on a GPU, what the engine's KV cache holds "
        "of rows of `row_tokens` tokens, sized at start from the model's config.json and the GPU's free memory "
        "(docs/gpu.md); on the CPU and where sizing fails, 128 (what vLLM itself gives inside Ray Data LLM, not "
        "its LLM class's per-GPU default). A number pins it.",
    )
    max_num_batched_tokens: int | str | None = Field(
        "auto",
        description="Tokens per engine step. 'auto': on a GPU, the largest of 16384/8192/4096/2048 that is at most "
        "an eighth of the KV cache (docs/gpu.md); on the CPU, vLLM's. None: vLLM's, which inside Ray Data LLM "
        "is 2048 (its engine is built without a usage context). A number pins it.",
    )
    row_tokens: int = Field(
        600,
        ge=1,
        description="A typical row's prompt + output tokens: the unit `max_num_seqs: auto` divides the KV cache by.",
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache across prompts sharing a prefix.")
    enable_chunked_prefill: bool = Field(
        True,
        description="Split long prefills across steps. On the CPU it is turned off whenever a sampling seed is set "
        "(config or any row): vLLM's CPU build cannot rewind a seeded request's generator after a partial prefill "
        "(`CPU Generator does not use offset`) and the engine dies; max_num_batched_tokens is then raised to "
        "max_model_len so every prompt prefills in one step. Setting it true with a seed on the CPU is refused.",
    )
    enforce_eager: bool = Field(False, description="Skip graph capture/compile: faster start, on CPU about equal.")
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field("auto", description="Weights and activations.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine replica.")
    seed: int = Field(0, description="Engine seed; sampling with a per-row seed is reproducible.")
    cpu_kvcache_space_gib: int = Field(2, ge=1, description="KV cache size on the CPU (VLLM_CPU_KVCACHE_SPACE).")
    crash_retries: int = Field(
        1,
        ge=0,
        description="Times a batch that was running when the engine died is rerun whole, alone, before it is "
        "split in halves to find the row(s) that kill the engine (recorded as `engine_crash` errors).",
    )
    max_consecutive_crashes: int = Field(
        12,
        ge=1,
        description="Engine deaths per replica with no row answered in between before the run fails as a "
        "crash loop (`_failed.json`), instead of restarting forever.",
    )
    hang_timeout_s: float = Field(
        180.0,
        ge=1.0,
        description="Seconds an engine may make no progress (no scheduler step returns any output) while it has "
        "requests: then it is stuck, and it is rebuilt and its rows bisected as after a crash (`engine_hang` for "
        "a row that hangs it alone). A healthy engine returns output every step, at most a few seconds apart "
        "(one prefill chunk on the CPU); 180 s is far above that and far below a night (docs/bad-rows.md).",
    )
    max_actor_restarts: int = Field(
        3,
        ge=0,
        description="Ray restarts of an engine actor that died outright (killed for memory, or its node lost); "
        "Ray Data's default is unlimited. Its batches are retried on the restarted actor, however long it takes.",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Further vLLM engine arguments, passed through unchanged."
    )

    @property
    def unsized_max_num_seqs(self) -> int:
        """max_num_seqs where no GPU sizes `auto` (workload/engine/auto_settings.py)."""
        return UNSIZED_MAX_NUM_SEQS if self.max_num_seqs == "auto" else int(self.max_num_seqs)

    @field_validator("max_num_seqs", "max_num_batched_tokens", mode="before")
    @classmethod
    def _number_or_auto(cls, value: Any, info: Any) -> Any:
        # One message for every wrong shape (a union would list each branch's complaint).
        least = 1 if info.field_name == "max_num_seqs" else 16
        if value == "auto" or (value is None and info.field_name == "max_num_batched_tokens"):
            return value
        number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
        if isinstance(number, int) and not isinstance(number, bool) and number >= least:
            return number
        raise ValueError(f"must be 'auto' or an integer of at least {least}, got {value!r}")


class StagesConfig(_Strict):
    """CPU stages before the engine (chat template, tokenize); vLLM itself decodes the text."""

    tokenize_on_cpu: bool | None = Field(
        None,
        description="Tokenize as a separate CPU stage, so the engine actor only schedules and decodes. Unset: on with "
        "device gpu, off with device cpu (the engine tokenizes itself; two more actors on the engine's own cores "
        "cost more than they save: docs/benchmark.md).",
    )
    num_cpus: float = Field(
        0.1,
        gt=0,
        description="CPUs reserved per CPU-stage actor and per task of the job's own CPU operators (the read, "
        "the validation, the cut into one block per batch).",
    )
    concurrency: int = Field(1, ge=1, description="Actors per CPU stage.")
    batch_size: int = Field(64, ge=1, description="Rows per batch in the CPU stages.")


class SamplingParams(_Strict):
    """Default sampling; a row's own `sampling_params` override these field by field."""

    max_tokens: int = Field(64, ge=1, description="Most tokens to generate per row.")
    min_tokens: int = Field(0, ge=0, description="Fewest tokens before EOS may end a row.")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=-1, description="0 or -1: off.")
    repetition_penalty: float = Field(1.0, gt=0.0, description="1: off.")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="0: off.")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="0: off.")
    stop: list[str] = Field(default_factory=list, description="Strings that end a row's output.")
    seed: int | None = Field(None, description="Per-row sampling seed, for reproducible sampling.")
    ignore_eos: bool = Field(False, description="Generate max_tokens even past EOS (benchmarks).")
    n: int = Field(1, ge=1, le=16, description="Samples per row (results: `choices`).")
    logprobs: int | None = Field(
        None, ge=0, le=20, description="Log probabilities of the sampled token and this many top tokens per step."
    )
    structured_outputs: str | None = Field(
        None,
        description='vLLM\'s structured outputs as JSON (an object is accepted): e.g. {"json": SCHEMA} or '
        '{"json_object": true}; the answer is constrained to it.',
    )
    logit_bias: str | None = Field(None, description="Token id -> bias, as JSON (an object is accepted).")
    # vLLM's own sampling fields that `vllm run-batch` takes on a line (issue 55): each reaches vLLM's
    # SamplingParams under the same name, as vLLM's server passes it.
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Least probability, relative to the likeliest token; 0: off.")
    stop_token_ids: list[int] = Field(default_factory=list, description="Token ids that end a row's output.")
    include_stop_str_in_output: bool = Field(False, description="Keep the stop string that ended a row in its text.")
    skip_special_tokens: bool = Field(True, description="Leave special tokens out of the text.")
    spaces_between_special_tokens: bool = Field(True, description="Put spaces between special tokens in the text.")

    @field_validator("structured_outputs", "logit_bias", mode="before")
    @classmethod
    def _as_json(cls, value: Any) -> Any:
        # Kept as JSON text: one Arrow type for every row, whatever the schema's shape (JSON_FIELDS below).
        return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _min_le_max(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) is more than max_tokens ({self.max_tokens})")
        return self

    @classmethod
    def restore_types(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """A row's sampling keys as vLLM must get them, after Arrow and pandas/numpy had them.

        An integer column with nulls comes back as floats (a seed set in some rows only: 3.0, and NaN for the
        others), numpy scalars and arrays are not plain Python, and vLLM's engine core validates types strictly:
        a float seed killed its input thread and hung the engine. Each field gets its declared type back; NaN
        and None are "not set" where the field allows it. A value that cannot be its type is a TypeError naming
        the field (the row's error)."""
        typed: dict[str, Any] = {}
        for name, value in values.items():
            if name in JSON_SAMPLING_FIELDS:
                typed[name] = JSON_SAMPLING_FIELDS[name](value)
                continue
            field = cls.model_fields.get(name)
            value = value.tolist() if hasattr(value, "tolist") else value  # numpy scalars and arrays
            if field is None:
                typed[name] = value
                continue
            args = getattr(field.annotation, "__args__", ())
            optional = type(None) in args
            if value is None or (isinstance(value, float) and math.isnan(value)):
                if not optional:
                    raise TypeError(f"sampling_params.{name} is null")
                typed[name] = None
                continue
            kind = next(a for a in args if a is not type(None)) if optional else field.annotation
            if kind is int and isinstance(value, float):
                if not value.is_integer():
                    raise TypeError(f"sampling_params.{name} must be an integer, got {value!r}")
                value = int(value)
            elif kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            typed[name] = value
        return typed

    def for_engine(self) -> dict[str, Any]:
        """The keyword arguments of vLLM's SamplingParams. Every row gets every key, so the column that carries
        them through Ray Data has one schema."""
        return self.model_dump()


def _structured(value: Any) -> dict[str, Any] | None:
    return None if value is None else dict(json.loads(value))


def _logit_bias(value: Any) -> dict[int, float] | None:
    return None if value is None else {int(k): float(v) for k, v in json.loads(value).items()}


# Sampling fields that travel as JSON text (one Arrow type for every row) and reach vLLM as objects.
JSON_SAMPLING_FIELDS = {"structured_outputs": _structured, "logit_bias": _logit_bias}


class MetricsConfig(_Strict):
    sink: Literal["none", "cloudwatch"] = Field(
        "none", description="Where metrics and logs go; 'none' keeps the local demo off AWS."
    )
    namespace: str = Field(DEFAULT_METRICS_NAMESPACE, description="CloudWatch metrics namespace.")
    stack: str = Field("local", description="The `Stack` dimension every alarm filters on.")
    run_id: str | None = Field(None, description="The `Run` dimension; default: the run's start time.")
    log_group: str | None = Field(None, description="CloudWatch Logs group; None: no log shipping.")
    region: str | None = Field(None, description="AWS region; None: the environment's.")
    price_per_hour_usd: float = Field(
        0.0, ge=0.0, description="What the run's compute costs an hour, for cost per million tokens."
    )
    publish_interval_s: float = Field(
        60.0,
        gt=0.0,
        le=ALARM_PERIOD_S,
        description="Seconds between metric publications; at most the alarm period: no gap in a live run.",
    )
    gpu_sample_interval_s: float = Field(
        10.0, gt=0.0, description="Seconds between NVML utilisation samples (only where a GPU exists)."
    )


class ResumeConfig(_Strict):
    mode: Literal["resume", "restart"] = Field(
        "resume",
        description="'resume' finishes what an earlier attempt left; 'restart' deletes the old output first.",
    )
    grace_period_s: float = Field(
        90.0, gt=0, description="After SIGTERM: seconds to commit finished shards and exit (Spot gives 120)."
    )
    lease_ttl_s: float = Field(
        120.0,
        ge=10,
        description="Life of an attempt's lease on its output, renewed every third of it while the attempt lives: "
        "a dead attempt blocks the next one for at most this long (plus 5 s for clock skew).",
    )
    lease_wait_s: float = Field(
        0.0,
        ge=0,
        description="When another live attempt holds the output's lease: 0 refuses at once (exit code 4); "
        "more waits up to this many seconds for it to finish or expire.",
    )


def _comparable(uri: str) -> str:
    """A URI as a path to compare: s3://bucket/prefix as is, a local path absolute and normalised."""
    if uri.startswith("s3://"):
        return "s3://" + "/".join(part for part in uri.removeprefix("s3://").split("/") if part)
    return os.path.realpath(os.path.expanduser(uri))


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


class JobConfig(_Strict):
    input: InputConfig
    output: OutputConfig
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    stages: StagesConfig = StagesConfig()
    sampling: SamplingParams = SamplingParams()
    task: Literal["generate", "embed"] = Field(
        "generate",
        description="What the engine does with each row: 'generate' answers prompts or messages; 'embed' turns each "
        "row's `input` (or `prompt`) text into one vector (vLLM's pooling runner; a causal LM pools its last "
        "token's hidden state). An OpenAI Batch input whose url is /v1/embeddings embeds whatever this says.",
    )
    device: Literal["cpu", "gpu"] = Field("cpu", description="Where the engine runs.")
    replicas: int = Field(1, ge=1, description="Engine replicas (one per GPU group, or per CPU placement).")
    max_replicas: int | None = Field(
        None,
        ge=1,
        description="If set, engine replicas autoscale from `replicas` up to this (e.g. Karpenter).",
    )
    batch_size: int = Field(32, ge=1, description="Rows per batch sent to an engine replica.")
    max_concurrent_batches: int | str = Field(
        "auto",
        description="Batches in flight per replica. 'auto': enough for 4x the engine's max_num_seqs (a pinned "
        "value, 128 on the CPU, on a GPU the 1,024 that sizing settles on at most), bounded by an eighth of the "
        "driver's memory (workload/engine/feed.py, docs/benchmark.md: the feed). A number pins it.",
    )
    metrics: MetricsConfig = MetricsConfig()
    resume: ResumeConfig = ResumeConfig()

    @field_validator("max_concurrent_batches", mode="before")
    @classmethod
    def _batches_or_auto(cls, value: Any) -> Any:
        # One message for every wrong shape (a union would list each branch's complaint).
        number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
        if value == "auto" or (isinstance(number, int) and not isinstance(number, bool) and number >= 1):
            return value if value == "auto" else number
        raise ValueError(f"must be 'auto' or an integer of at least 1, got {value!r}")

    @model_validator(mode="after")
    def _output_apart_from_input(self) -> JobConfig:
        # An output under its input (or the reverse) would be read back as input by the next attempt: its
        # results and markers become rows, and the run can never resume. Decided on the URIs, before any I/O.
        source, target = _comparable(self.input.uri), _comparable(self.output.uri)
        if _within(target, source):
            raise ValueError(f"output.uri {self.output.uri} is inside input.uri {self.input.uri}: use a folder apart")
        if _within(source, target):
            raise ValueError(f"input.uri {self.input.uri} is inside output.uri {self.output.uri}: use a folder apart")
        return self

    @model_validator(mode="after")
    def _engine_fits_device(self) -> JobConfig:
        if self.device == "cpu" and self.engine.tensor_parallel_size != 1:
            raise ValueError("engine.tensor_parallel_size must be 1 when device is 'cpu'")
        problem = seeded_cpu_conflict(self, seeded=self.sampling.seed is not None)
        if problem:
            raise ValueError(problem)
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is less than replicas ({self.replicas})")
        return self

    @property
    def tokenizer_stages(self) -> bool:
        """Whether tokenize runs as a stage of its own (`stages.tokenize_on_cpu`, by device if unset)."""
        return self.device == "gpu" if self.stages.tokenize_on_cpu is None else self.stages.tokenize_on_cpu

    def output_hash(self) -> str:
        """Hash of every setting that changes what a row's output is; resume refuses to mix two of them."""
        return hashlib.sha256(json.dumps(self.output_affecting(), sort_keys=True).encode()).hexdigest()[:16]

    def output_affecting(self) -> dict[str, Any]:
        engine = self.engine.model_dump(include={"max_model_len", "dtype", "seed", "extra"})
        affecting = {
            "model": _model_affecting(self.model),
            "engine": engine,
            "sampling": _settled(self.sampling),
            "input": _settled(self.input),
            "shard_rows": self.output.shard_rows,
        }
        if self.task != "generate":  # a later field, kept out at its default as LATER_FIELDS are
            affecting["task"] = self.task
        return affecting


# Output-affecting fields added after outputs were first written: left out while at their default, so an output
# begun by an earlier version still resumes (its manifest has no such key, and the default is what it ran with).
LATER_FIELDS = frozenset(
    {"n", "logprobs", "structured_outputs", "logit_bias", "max_record_bytes", "openai_url"}
    | {"min_p", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens"}
    | IMAGE_FIELDS
    | IMAGE_FILE_FIELDS
)


def _model_affecting(model: ModelConfig) -> dict[str, Any]:
    affecting = model.model_dump(include={"source", "load_format"})
    if model.reasoning is not None:  # a later field: kept out while no parser runs, as LATER_FIELDS are
        affecting["reasoning_parser"] = model.reasoning
    if model.tool_call_parser != AUTO:
        # A later field (issue 56), kept out at `auto`: `auto` gives the embedded model a parser, and an output
        # begun before tools were answered must still resume (its rows with tools were errors then, and stay so).
        affecting["tool_call_parser"] = model.tools
    if model.adapters:  # a later field (issue 57), kept out while empty
        affecting["adapters"] = {name: a.model_dump() for name, a in sorted(model.adapters.items())}
    return affecting


def _settled(section: BaseModel) -> dict[str, Any]:
    values = section.model_dump()
    for name in LATER_FIELDS & set(values):
        if values[name] == type(section).model_fields[name].get_default(call_default_factory=True):
            del values[name]
    return values


def seeded_cpu_conflict(config: JobConfig, seeded: bool) -> str | None:
    """Why engine settings the user chose cannot run seeded rows on the CPU, or None. Unset settings are chosen
    for them instead (`workload.engine.pipeline.engine_kwargs`)."""
    if config.device != "cpu" or not seeded:
        return None
    engine = config.engine
    if "enable_chunked_prefill" in engine.model_fields_set and engine.enable_chunked_prefill:
        return (
            "engine.enable_chunked_prefill is true with a sampling seed on the CPU: vLLM's CPU build kills the "
            "engine on a seeded request whose prefill is chunked (CPU Generator does not use offset). "
            "Remove engine.enable_chunked_prefill (the job then turns it off), or drop the seed"
        )
    budget = engine.max_num_batched_tokens
    if isinstance(budget, int) and budget < engine.max_model_len:
        return (
            f"engine.max_num_batched_tokens ({engine.max_num_batched_tokens}) is less than engine.max_model_len "
            f"({engine.max_model_len}) with a sampling seed on the CPU: a prompt would be prefilled in chunks, "
            "which kills vLLM's CPU engine for seeded requests. Remove engine.max_num_batched_tokens or raise it "
            "to max_model_len, or drop the seed"
        )
    return None


class ConfigError(ValueError):
    """A config that must stop the run before any work; the message names the field."""


def _format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {key}: {item['msg']}")
    return "invalid job config:\n" + "\n".join(lines)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"invalid job config:\n  {dotted}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def build_config(data: dict[str, Any], overrides: dict[str, Any] | None = None) -> JobConfig:
    """Validate a config dict, with dotted-key overrides (e.g. {"model.source": "..."}) applied first."""
    merged = json.loads(json.dumps(data))  # a deep copy: never mutate the caller's dict
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(merged, dotted, value)
    try:
        return JobConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error)) from None


def read_config_file(path: str | Path | None) -> dict[str, Any]:
    """A YAML or JSON config file as a mapping ({} for none); ConfigError names the file and what is wrong."""
    if path is None:
        return {}
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {file}")
    try:
        loaded = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or error
        raise ConfigError(f"config file {file} is not valid YAML/JSON{where}: {problem}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {file} must hold a mapping, not {type(loaded).__name__}")
    return loaded or {}


def load_config(
    path: str | Path | None, overrides: dict[str, Any] | None = None, defaults: dict[str, Any] | None = None
) -> JobConfig:
    """Read a YAML or JSON config file (or none) and apply overrides; `defaults` (dotted keys) fill only gaps."""
    data = read_config_file(path)
    for dotted, value in (defaults or {}).items():
        node: Any = data
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            _set_dotted(data, dotted, value)
    return build_config(data, overrides)


def render_config(config: JobConfig) -> str:
    """The YAML a node or pod is given; `load_config` reads it back to an equal model."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
