"""The online endpoint's config: the batch job's model and engine sections, plus a `serve` section of its own.

One config model, shared keys: `model`, `engine`, `device`, `replicas` and `max_replicas` are the job's own
classes (workload.contract.config), so a job config file starts an endpoint over the same model with the same engine
settings. Sections that only mean something to a batch run (input, output, stages, ...) are accepted in the
file and left unused; any other unknown key stops the start, as it does for the job. Like workload.contract.config, this
module imports neither Ray nor vLLM.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workload.contract.config import ConfigError, EngineConfig, JobConfig, ModelConfig, read_config_file

DEFAULT_MODEL_ID = "llm-batch"
# The body cap's default: a prompt filling the context, each token as JSON-escaped text at its longest (the longest
# tokens of common vocabularies are about 16 characters; a character escaped as `\uXXXX` is 6 bytes, a surrogate
# pair 12) or as a token id (at most 7 bytes with its comma), plus room for the request's other fields.
BODY_BYTES_PER_TOKEN = 64
BODY_OVERHEAD_BYTES = 2**20
# vLLM's switches that write prompts or answers to the log (vllm/engine/arg_utils.py, AsyncEngineArgs).
PROMPT_LOG_SWITCHES = ("enable_log_requests", "enable_log_outputs", "disable_log_requests")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServeSettings(_Strict):
    """What only the endpoint has: where it listens, what clients call the model, and the Serve features."""

    host: str = Field(
        "127.0.0.1",
        description="Address the HTTP endpoint binds; 0.0.0.0 only behind a firewall or a private load balancer.",
    )
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the OpenAI-compatible endpoint.")
    model_id: str = Field(DEFAULT_MODEL_ID, min_length=1, description="The `model` name clients send.")
    max_ongoing_requests: int = Field(
        256,
        ge=1,
        description="Requests in flight per engine replica before Serve queues them (the engine batches "
        "up to engine.max_num_seqs of them at once).",
    )
    haproxy: bool = Field(
        True,
        description="Ray Serve's HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY) in place of its Python proxy. Its "
        "listeners (and the replicas' HTTP ports) bind serve.host.",
    )
    direct_streaming: bool = Field(
        True,
        description="Stream tokens from the engine replica straight to HAProxy "
        "(RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING): vLLM's own API server answers. Needs haproxy; when not set, "
        "follows haproxy.",
    )
    ingress_num_cpus: float = Field(0.1, ge=0.0, description="CPUs Ray reserves for each ingress replica.")
    replica_num_cpus: float = Field(
        0.1,
        ge=0.0,
        description="CPUs Ray reserves for each engine replica's own actor (the engine gets one more).",
    )
    start_timeout_s: float = Field(900.0, gt=0, description="How long the engine may take to become ready.")
    api_key_file: str | None = Field(
        None,
        description="A file of API keys, one per line, re-read every 30 s (rotation without a restart); in place of "
        "LLM_BATCH_API_KEY / LLM_BATCH_API_KEY_FILE. Keys are required unless serve.host is loopback.",
    )
    api_key_secret: str | None = Field(
        None,
        description='A Secrets Manager secret (id or ARN) holding the API keys (JSON {"keys": [...]} or one per '
        "line), re-read every 30 s: the EKS tiers' source (LLM_BATCH_API_KEY_SECRET).",
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="Largest request body read, in bytes (413 above it); None: engine.max_model_len tokens at "
        f"{BODY_BYTES_PER_TOKEN} bytes each plus {BODY_OVERHEAD_BYTES // 2**20} MiB for the rest of the request.",
    )
    cors_origins: tuple[str, ...] = Field(
        (),
        description="Browser origins allowed to call the endpoint (CORS, without credentials: the key travels in "
        "the Authorization header); none by default, so no browser page on another origin can call it.",
    )

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or '*'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _direct_streaming_follows_haproxy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "direct_streaming" not in data and data.get("haproxy") is False:
            return {**data, "direct_streaming": False}
        return data

    @model_validator(mode="after")
    def _direct_streaming_needs_haproxy(self) -> ServeSettings:
        if self.direct_streaming and not self.haproxy:
            raise ValueError("serve.direct_streaming needs serve.haproxy: Ray Serve LLM streams directly only there")
        return self


class ServeConfig(_Strict):
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    device: Literal["cpu", "gpu"] = Field("cpu", description="Where the engine runs.")
    replicas: int = Field(1, ge=1, description="Engine replicas.")
    max_replicas: int | None = Field(None, ge=1, description="If set, replicas autoscale up to this.")
    serve: ServeSettings = ServeSettings()

    @model_validator(mode="after")
    def _engine_fits_device(self) -> ServeConfig:
        if self.device == "cpu" and self.engine.tensor_parallel_size != 1:
            raise ValueError("engine.tensor_parallel_size must be 1 when device is 'cpu'")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is less than replicas ({self.replicas})")
        logging = sorted(set(PROMPT_LOG_SWITCHES) & set(self.engine.extra))
        if logging:
            # Refused, not overridden: a setting the endpoint silently ignored would look honoured to whoever set it.
            raise ValueError(
                f"engine.extra.{logging[0]}: the endpoint never logs prompts or answers (they are user data); remove it"
            )
        if self.model.adapters:
            # Refused, not ignored (as above): the endpoint routes no request to an adapter (issue 57 is the job's).
            raise ValueError(
                "model.adapters: the online endpoint serves the base model only; LoRA adapters are the batch job's "
                "(docs/job.md, 'LoRA adapters'); remove them from this config"
            )
        if self.serve.api_key_file and self.serve.api_key_secret:
            raise ValueError("serve.api_key_file and serve.api_key_secret: set one key source, not both")
        return self

    @property
    def max_body_bytes(self) -> int:
        """The request body cap: serve.max_body_bytes, or one that fits a prompt as long as the context."""
        if self.serve.max_body_bytes is not None:
            return self.serve.max_body_bytes
        return self.engine.max_model_len * BODY_BYTES_PER_TOKEN + BODY_OVERHEAD_BYTES

    def job_view(self) -> JobConfig:
        """The job-shaped view that the job's own engine-argument functions read (workload.engine.pipeline's
        engine_kwargs and engine_env), so the endpoint's engine cannot drift from the batch job's.

        Built without validation: it carries only the shared sections, already validated here; the job-only
        fields it lacks (input, output) are never read by those functions.
        """
        shared: dict[str, Any] = {name: getattr(self, name) for name in _SHARED_KEYS}
        return JobConfig.model_construct(**shared)


# A job config file is a valid serve config file: its batch-only sections are accepted and not used.
_SHARED_KEYS = frozenset(ServeConfig.model_fields) - {"serve"}
_JOB_ONLY_KEYS = frozenset(JobConfig.model_fields) - _SHARED_KEYS


def _format(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {key}: {item['msg']}")
    return "invalid serve config:\n" + "\n".join(lines)


def build_serve_config(data: dict[str, Any], overrides: dict[str, Any] | None = None) -> ServeConfig:
    """Validate a config dict (a serve or a job config), with dotted-key overrides applied first."""
    merged = {key: value for key, value in json.loads(json.dumps(data)).items() if key not in _JOB_ONLY_KEYS}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = merged
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"invalid serve config:\n  {dotted}: '{part}' is not a section")
            node = child
        node[leaf] = value
    try:
        return ServeConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(_format(error)) from None


def load_serve_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> ServeConfig:
    """Read a YAML or JSON file (or none: the embedded tiny model on the CPU) and apply overrides."""
    data = read_config_file(path)
    return build_serve_config(data, overrides)
