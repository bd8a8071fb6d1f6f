"""The Ray Serve LLM application: one LLMConfig, built from the endpoint's config with the job's engine settings.

Imports Ray Serve LLM; the config module stays free of it so the CLI can reject a bad config in milliseconds.
The builder touches no model: it names the model by its label, and each engine replica fetches it on its own node
(workload/serve/replica_model.py), as the batch job's actors do.
"""

from __future__ import annotations

from typing import Any

from workload.contract.serve_config import ServeConfig
from workload.engine.model_source import model_label
from workload.engine.pipeline import engine_env, engine_kwargs
from workload.serve.guard import EXPERIMENTAL_CONFIG_KEY, GuardSettings
from workload.serve.replica_model import callback_config


def llm_config_fields(config: ServeConfig) -> dict[str, Any]:
    """The fields of `ray.serve.llm.LLMConfig`, as plain data (tests and the benchmark's record read them).

    `model_source` is only the model's label (the folder each node will hold it in, or its hub id): the replica's
    callback resolves `config.model` on its own node before the engine starts and points the engine there.
    """
    job = config.job_view()
    settings = config.serve
    autoscaling = {
        "min_replicas": config.replicas,
        "initial_replicas": config.replicas,
        "max_replicas": config.max_replicas or config.replicas,
    }
    fields: dict[str, Any] = {
        "model_loading_config": {"model_id": settings.model_id, "model_source": model_label(config.model)},
        "callback_config": callback_config(config.model),
        # The batch job's own engine arguments. Stats logging stays on: Serve LLM's engine metrics need it.
        "engine_kwargs": engine_kwargs(job),
        "runtime_env": {"env_vars": engine_env(job)},
        "deployment_config": {
            "autoscaling_config": autoscaling,
            "max_ongoing_requests": settings.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": settings.replica_num_cpus},
        },
        # Engine metrics go to Ray's Prometheus port, which nothing scrapes locally.
        "log_engine_metrics": False,
    }
    if config.device == "cpu":
        # Without a placement group config Serve LLM assumes a GPU and waits for one forever.
        fields["placement_group_config"] = {"bundles": [{"CPU": 1}]}
    return fields


def build_app(config: ServeConfig, guard: GuardSettings) -> Any:
    """The OpenAI-compatible application (`/v1/models`, `/v1/models/{id}`, `/v1/chat/completions`,
    `/v1/completions`), behind `guard` (workload/serve/guard.py) on either request path."""
    from ray.serve.llm import LLMConfig

    if config.serve.direct_streaming:
        # The engine replica is the ingress itself (vLLM's own API server): Serve LLM's builder, with the guard (and
        # on the CPU the refusal of seeded requests) in front of vLLM's app (workload/serve/direct.py).
        from ray.serve.llm import build_openai_app

        from workload.serve.direct import CpuDirectServer, DirectServer

        llm_config = LLMConfig(
            **llm_config_fields(config),
            server_cls=CpuDirectServer if config.device == "cpu" else DirectServer,
            experimental_configs={EXPERIMENTAL_CONFIG_KEY: guard.to_dict()},
        )
        return build_openai_app({"llm_configs": [llm_config]})
    llm_config = LLMConfig(**llm_config_fields(config))
    from workload.serve.ingress import build_openai_app as build_mended_app

    ingress_options = {"ray_actor_options": {"num_cpus": config.serve.ingress_num_cpus}}
    return build_mended_app(llm_config, ingress_options, config.device, guard)
