"""The RayService runs the local endpoint's application: its serveConfigV2's builder, called with its own args,
builds Serve LLM's app, and the autoscaling override names a deployment that app really has.

Built with Ray Serve's own application builder (what `serve deploy` does before it starts anything), from an
s3:// model with no S3 reachable: the builder (on the head) must fetch nothing, only name the model for the
replicas, which fetch it on their own nodes. No engine is started. The builder starts a local Ray in this
process, which the test shuts down: a Ray left connected here makes every later in-process job's `ray.init` fail
(seen in CI).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import yaml

from infra.config import decode_pulumi_values, load_stack_config
from infra.eks_serve import rayservice_manifest
from infra.ops.stacks import read_stack_config

KEYS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-large/serve-api-keys-AbCdEf"


@pytest.fixture
def no_ray_left_behind() -> Iterator[None]:
    import ray

    assert not ray.is_initialized(), "an earlier test left Ray connected in this process"
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.usefixtures("no_ray_left_behind")
def test_the_serve_config_builds_the_endpoint_app_and_overrides_its_engine_deployment(tmp_path, monkeypatch) -> None:
    from ray.serve._private.build_app import build_app

    values, _ = read_stack_config(
        "large",
        {
            "serve.enabled": True,
            "eks.head_instance_type": "m5.2xlarge",
            "serve.min_replicas": 0,
            "job.model_source": "s3://weights/models/qwen",
            "job.model_weights_gib": 1.1,
            "job.job_overrides": {"model": {"cache_dir": str(tmp_path / "head")}},
        },
    )
    # Nowhere to fetch from: any S3 call from the builder would fail the build.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    config = load_stack_config("large", decode_pulumi_values(values))
    manifest = rayservice_manifest(config, "large", "r/i:1", api_keys_secret_arn=KEYS_ARN)
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    module, _, attribute = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attribute)
    built = build_app(builder(app["args"]), name=app["name"])
    names = {deployment.name for deployment in built.deployments}
    (override,) = app["deployments"]
    assert override["name"] in names, f"{override['name']} is not one of the app's deployments {sorted(names)}"
    engine = next(deployment for deployment in built.deployments if deployment.name == override["name"])
    # The app's own autoscaling (from the endpoint config) stays within what the override sets.
    assert engine._deployment_config.autoscaling_config.max_replicas == override["autoscaling_config"]["max_replicas"]
    # The engine replicas get the model's label and the callback that fetches it on their node; the head has nothing.
    (llm_config,) = [v for v in [*engine.init_args, *engine.init_kwargs.values()] if hasattr(v, "model_loading_config")]
    assert llm_config.model_loading_config.model_source == str(tmp_path / "head" / "s3" / "weights" / "models" / "qwen")
    assert llm_config.callback_config.callback_class == "workload.serve.replica_model:FetchModelOnNode"
    assert not (tmp_path / "head").exists()
