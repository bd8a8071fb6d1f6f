"""The run spec (workload/contract/entrypoint.py) is the one description of how the container starts, on every tier: the
small node's `docker run`, the RayJob's pods and the container tests render from it and agree."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from infra.components.user_data import BootSettings, render_user_data
from infra.k8s.rayjob import render_rayjob
from tests.infra.k8s_fixtures import medium_args
from workload.contract import entrypoint

HOST = entrypoint.HostPaths(models="/var/lib/llm-batch/models", config="/etc/llm-batch/job.yaml", secrets="/s")


def _pairs(flags: list[str]) -> list[tuple[str, str]]:
    return [(flags[i], flags[i + 1]) for i in range(len(flags) - 1) if flags[i].startswith("-")]


def test_docker_flags_carry_the_whole_spec() -> None:
    flags = entrypoint.docker_run_flags(HOST, entrypoint.stop_timeout_s(90))
    pairs = _pairs(flags)
    assert flags[0] == "--init" and "--read-only" in flags
    assert ("--user", "1000:1000") in pairs and ("--cap-drop", "ALL") in pairs
    assert ("--stop-timeout", "110") in pairs
    assert ("--tmpfs", "/tmp:rw,nosuid,nodev,size=4g,mode=1777") in pairs
    volumes = {value for flag, value in pairs if flag == "-v"}
    assert volumes == {
        "/var/lib/llm-batch/models:/models",
        "/etc/llm-batch/job.yaml:/etc/llm-batch/job.yaml:ro",
        "/s:/var/run/llm-batch/secrets:ro",
    }
    env = dict(value.split("=", 1) for flag, value in pairs if flag == "-e")
    assert env == {
        "HOME": "/tmp",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "RAY_worker_niceness": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_TOKEN_PATH": entrypoint.HUB_TOKEN_PATH,
    }
    # What only a GPU host has stays with that host.
    assert not {"--gpus", "--log-driver", "--shm-size"} & set(flags)


@pytest.mark.parametrize("bad", ["", " ", "/a:b", "/a,b", "/a\nb"])
def test_host_paths_docker_would_misread_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="host path for models"):
        entrypoint.HostPaths(models=bad, config="/c", secrets="/s")


def test_stop_timeout_is_the_grace_period_and_the_margin() -> None:
    assert entrypoint.stop_timeout_s(20) == 40 and entrypoint.stop_timeout_s(20.2) == 41
    with pytest.raises(ValueError, match="negative"):
        entrypoint.stop_timeout_s(-1)


def test_the_small_nodes_docker_run_is_the_spec_plus_the_gpu_hosts_own_flags() -> None:
    settings = BootSettings(
        region="us-east-1",
        image="1.dkr.ecr.us-east-1.amazonaws.com/w:1",
        job_settings_secret_arn="a",
        hub_token_secret_arn="b",
        log_group="/g",
        group_name="g",
        output_prefix_uri="s3://b/o/{date}/",
    )
    script = render_user_data(settings)
    line = script.split("\n  docker run ", 1)[1].split(" \\\n", 1)[0]  # inside the loop over the queue's runs
    host = entrypoint.HostPaths(
        models=settings.models_dir, config=f"{settings.config_dir}/job.yaml", secrets=f"{settings.config_dir}/secrets"
    )
    assert shlex.split(line) == entrypoint.docker_run_flags(host, settings.stop_timeout_s)
    assert "--gpus all" in script and "--log-driver awslogs" in script


def test_the_rayjobs_ray_containers_are_the_spec() -> None:
    rayjob = render_rayjob(medium_args())
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]]
    for pod in pods:
        assert pod["securityContext"] == entrypoint.pod_security_context()
        ray = pod["containers"][0]
        assert ray["securityContext"] == entrypoint.container_security_context()
        assert ray["securityContext"]["readOnlyRootFilesystem"] is True
        assert ray["env"][: len(entrypoint.ENV)] == entrypoint.k8s_env()
        scratch = [m for m in ray["volumeMounts"] if m["mountPath"] == entrypoint.SCRATCH_DIR]
        assert len(scratch) == 1
        (volume,) = [v for v in pod["volumes"] if v["name"] == scratch[0]["name"]]
        assert volume == entrypoint.k8s_scratch_volume(scratch[0]["name"])
        mounts = {m["mountPath"] for m in ray["volumeMounts"]}
        assert {entrypoint.MODELS_DIR, str(Path(entrypoint.CONFIG_PATH).parent)} <= mounts
