"""The RayService runs the local endpoint's application: its serveConfigV2's builder, called with its own args,
builds Serve LLM's app, and the autoscaling override names a deployment that app really has.

Built with Ray Serve's own application builder (what `serve deploy` does before it starts anything), over the
job's tiny demo model; no engine is started. The builder starts a local Ray in this process, which the test shuts
down: a Ray left connected here makes every later in-process job's `ray.init` fail (seen in CI).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import yaml

from infra.config import decode_pulumi_values, load_stack_config
from infra.eks_serve import rayservice_manifest
from infra.ops.stacks import read_stack_config


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
            "job.job_overrides": {"model": {"cache_dir": str(tmp_path)}},
        },
    )
    config = load_stack_config("large", decode_pulumi_values(values))
    manifest = rayservice_manifest(config, "large", "r/i:1")
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
