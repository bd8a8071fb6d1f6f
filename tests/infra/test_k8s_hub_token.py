"""The hub token's way into the Ray pods: the init container's script run for real against a moto server."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.k8s import hub_token
from infra.k8s.rayjob import RayJobArgs, render_rayjob
from tests.infra.crd_schema import assert_valid
from tests.infra.k8s_fixtures import large_args, medium_args
from workload.contract import entrypoint

TOKEN = "hf_not_a_real_token_0123456789"


def _with_token(args: RayJobArgs, arn: str) -> RayJobArgs:
    return args.model_copy(update={"hub_token_secret_arn": arn})


def _pods(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    spec = rayjob["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"]["template"]["spec"], spec["workerGroupSpecs"][0]["template"]["spec"]]


@pytest.mark.parametrize("make", [medium_args, large_args], ids=["medium", "large"])
def test_every_ray_pod_fetches_the_token_first(make: Any, crds_dir: Path) -> None:
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-medium-hub-token-AbCdEf"
    rayjob = render_rayjob(_with_token(make(), arn))
    assert_valid(rayjob, crds_dir)
    for pod in _pods(rayjob):
        (init,) = pod["initContainers"]
        assert {"name": "HUB_TOKEN_SECRET_ARN", "value": arn} in init["env"]
        assert init["image"] == pod["containers"][0]["image"]
        container, *sidecars = pod["containers"]
        assert {"name": "HF_TOKEN_PATH", "value": hub_token.TOKEN_FILE} in container["env"]
        assert hub_token.container_mount() in container["volumeMounts"]
        # The GPU reporter never loads a model: the token stays out of its reach.
        for sidecar in sidecars:
            assert hub_token.container_mount() not in sidecar["volumeMounts"]
            assert all(env["name"] != "HF_TOKEN_PATH" for env in sidecar.get("env", []))
        assert hub_token.volume() in pod["volumes"]
        assert hub_token.volume()["emptyDir"]["medium"] == "Memory"


def test_without_a_token_the_pods_are_unchanged() -> None:
    args = medium_args()
    head, worker = _pods(render_rayjob(args))
    # The head also tells Ray's job supervisor how long a stopped job may take (test_k8s_rayjob.py).
    stop_wait = {"name": "RAY_JOB_STOP_WAIT_TIME_S", "value": str(args.termination_grace_s)}
    for pod, extra in ((head, [stop_wait]), (worker, [])):
        assert "initContainers" not in pod
        # Only the run spec's environment (workload/contract/entrypoint.py ENV): no token path to a file that is not
        # there.
        assert pod["containers"][0]["env"] == [*entrypoint.k8s_env(), *extra]
        assert all(env["name"] != "HF_TOKEN_PATH" for env in pod["containers"][0]["env"])


def _run_script(arn: str, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HUB_TOKEN_SECRET_ARN": arn, "HUB_TOKEN_PATH": str(path)}
    return subprocess.run(
        [sys.executable, "-c", hub_token.FETCH_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )


def test_fetch_script_writes_the_token_owner_read_only(moto_reset: str, tmp_path: Path) -> None:
    arn = boto3.client("secretsmanager").create_secret(Name="hub-token", SecretString=f"{TOKEN}\n")["ARN"]
    path = tmp_path / "hub_token"
    result = _run_script(arn, path)
    assert result.returncode == 0, result.stderr
    assert path.read_text() == TOKEN
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert TOKEN not in result.stdout + result.stderr
    assert "hub token written" in result.stdout


def test_fetch_script_tolerates_a_secret_with_no_value(moto_reset: str, tmp_path: Path) -> None:
    arn = boto3.client("secretsmanager").create_secret(Name="hub-token-unset")["ARN"]
    path = tmp_path / "hub_token"
    result = _run_script(arn, path)
    assert result.returncode == 0, result.stderr
    assert not path.exists()
    assert "public models only" in result.stdout


def test_fetch_script_fails_the_pod_when_the_secret_is_missing(moto_reset: str, tmp_path: Path) -> None:
    """A wrong ARN (or no access) must stop the pod with the error, not pass for 'no token'."""
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:no-such-secret-AbCdEf"
    result = _run_script(arn, tmp_path / "hub_token")
    assert result.returncode != 0
    assert "ResourceNotFoundException" in result.stderr
    assert not (tmp_path / "hub_token").exists()
