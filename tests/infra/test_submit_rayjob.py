"""The VPC submit function: RayJob lifecycle against a TLS Kubernetes API, node groups on the moto server."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import jsonschema
import pytest
import yaml

from infra.functions.submit_rayjob import handler as submit
from tests.infra.fake_kube import FakeKube, self_signed_cert

NAMESPACE = "llm-batch"
RAYJOBS = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayjobs"
CLUSTER = "llm-batch-medium"
NODEGROUP = "llm-batch-medium-gpu-spot"

# The shape of what infra/k8s renders for the nightly run: a RayJob whose entrypoint runs the job with the
# stack's config; the function appends the night's --input/--output.
TEMPLATE: dict[str, Any] = {
    "apiVersion": "ray.io/v1",
    "kind": "RayJob",
    "metadata": {"name": "template", "labels": {"app.kubernetes.io/part-of": "llm-batch"}},
    "spec": {
        "entrypoint": "python -m workload run --config /etc/llm-batch/job.yaml",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": 300,
        "rayClusterSpec": {
            "rayVersion": "2.60.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "llm-batch:test"}]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": 2,
                    "minReplicas": 0,
                    "maxReplicas": 2,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-worker", "image": "llm-batch:test"}]}},
                }
            ],
        },
    },
}


def _rayjob_schema(crds_dir: Path) -> dict[str, Any]:
    crd = yaml.safe_load((crds_dir / "ray.io_rayjobs.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKube]:
    server = FakeKube(tmp_path)
    yield server
    server.stop()


def _env(kube: FakeKube, tmp_path: Path, **extra: str) -> dict[str, str]:
    template = tmp_path / "rayjob_template.json"
    template.write_text(json.dumps(TEMPLATE))
    return {
        "CLUSTER_NAME": CLUSTER,
        "API_SERVER": kube.url,
        "CLUSTER_CA": base64.b64encode(kube.ca_pem.encode()).decode(),
        "NAMESPACE": NAMESPACE,
        "NAME_PREFIX": "llm-batch-medium",
        "CAPACITY_MODE": "nodegroup",
        "NODEGROUP": NODEGROUP,
        "GPU_NODES": "2",
        "AWS_REGION": "us-east-1",
        "RAYJOB_TEMPLATE": str(template),
        **extra,
    }


@pytest.fixture
def nodegroup(moto_reset: str) -> str:
    eks = boto3.client("eks")
    eks.create_cluster(
        name=CLUSTER, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": []}
    )
    eks.create_nodegroup(
        clusterName=CLUSTER,
        nodegroupName=NODEGROUP,
        nodeRole="arn:aws:iam::123456789012:role/nodes",
        subnets=["subnet-1"],
        scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 0},
    )
    return NODEGROUP


def _desired(nodegroup: str) -> int:
    described = boto3.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName=nodegroup)
    return int(described["nodegroup"]["scalingConfig"]["desiredSize"])


def _run_event(attempt: int = 1) -> dict[str, Any]:
    return {
        "action": "submit",
        "date": "2026-11-28",
        "attempt": attempt,
        "input_uri": "s3://llm-batch-medium-data/input/2026-11-28/",
        "output_uri": "s3://llm-batch-medium-data/output/2026-11-28/",
    }


def test_a_night_on_a_node_group_tier(
    kube: FakeKube, nodegroup: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crds_dir: Path
) -> None:
    for key, value in _env(kube, tmp_path).items():
        monkeypatch.setenv(key, value)

    assert "node group" in submit.handler({"action": "capacity_up"})["capacity"]
    assert _desired(nodegroup) == 2

    first = submit.handler(_run_event(attempt=1))
    assert first["name"] == "llm-batch-medium-2026-11-28-a1"
    manifest = kube.objects[f"{RAYJOBS}/{first['name']}"]
    jsonschema.validate(manifest, _rayjob_schema(crds_dir))
    assert manifest["spec"]["entrypoint"] == (
        "python -m workload run --config /etc/llm-batch/job.yaml "
        "--input s3://llm-batch-medium-data/input/2026-11-28/ --output s3://llm-batch-medium-data/output/2026-11-28/"
    )
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llm-batch-nightly"
    assert manifest["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llm-batch"
    # Every call carried an EKS bearer token.
    assert all(auth.startswith("Bearer k8s-aws-v1.") for _, _, auth in kube.requests)

    assert submit.handler({"action": "status", "name": first["name"]})["phase"] == "running"
    manifest["status"] = {"jobDeploymentStatus": "Failed", "jobStatus": "", "reason": "SubmissionFailed"}
    status = submit.handler({"action": "status", "name": first["name"]})
    assert status["phase"] == "failed" and status["retryable"] is True

    # The retry replaces the first attempt: one driver per output.
    second = submit.handler(_run_event(attempt=2))
    assert second == {"name": "llm-batch-medium-2026-11-28-a2", "removed": [first["name"]]}
    assert kube.names(RAYJOBS) == [second["name"]]
    # A retried invocation (Step Functions' Retry after a timeout) finds it created and carries on.
    assert submit.handler(_run_event(attempt=2))["name"] == second["name"]

    released = submit.handler({"action": "release"})
    assert released["deleted_rayjobs"] == [second["name"]]
    assert kube.names(RAYJOBS) == []
    assert _desired(nodegroup) == 0
    # Releasing twice (the sweep after a run) is harmless.
    assert submit.handler({"action": "release"})["deleted_rayjobs"] == []


def test_release_on_a_karpenter_tier_deletes_the_gpu_nodeclaims(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    env = _env(kube, tmp_path, CAPACITY_MODE="karpenter", KARPENTER_NODEPOOL="gpu-spot", NODEGROUP="")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for name, pool in (("gpu-a", "gpu-spot"), ("gpu-b", "gpu-spot"), ("system-a", "system")):
        kube.put(submit.NODECLAIMS, {"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool}}})
    assert "Karpenter" in submit.handler({"action": "capacity_up"})["capacity"]
    submit.handler(_run_event())
    released = submit.handler({"action": "release"})
    assert released["deleted_rayjobs"] == ["llm-batch-medium-2026-11-28-a1"]
    assert kube.names(submit.NODECLAIMS) == ["system-a"]
    assert "2 NodeClaim(s)" in released["capacity"]


def test_a_rayjob_that_vanished_counts_as_a_retryable_failure(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    for key, value in _env(kube, tmp_path).items():
        monkeypatch.setenv(key, value)
    status = submit.handler({"action": "status", "name": "llm-batch-medium-2026-11-28-a1"})
    assert status["phase"] == "failed" and status["retryable"] is True and "gone" in status["reason"]


def test_the_api_server_certificate_is_verified(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    _, _, other_ca = self_signed_cert(other_dir, common_name="someone-else")
    env = _env(kube, tmp_path, CLUSTER_CA=base64.b64encode(other_ca.encode()).decode())
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        submit.handler({"action": "status", "name": "x"})
    assert kube.requests == []


def test_the_token_is_a_presigned_sts_call_naming_the_cluster(moto_endpoint: str) -> None:
    token = submit.eks_token(CLUSTER, "eu-west-1")
    assert token.startswith("k8s-aws-v1.")
    encoded = token.removeprefix("k8s-aws-v1.")
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    assert parsed.netloc == "sts.eu-west-1.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"]
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"][0].split(";")
    assert query["X-Amz-Expires"] == ["60"]


@pytest.mark.parametrize(
    ("status", "phase", "retryable"),
    [
        ({}, "running", False),
        ({"jobDeploymentStatus": "Initializing"}, "running", False),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, "running", False),
        ({"jobDeploymentStatus": "Retrying"}, "running", False),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, "succeeded", False),
        ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"}, "failed", False),
        ({"jobDeploymentStatus": "Failed", "reason": "SubmissionFailed"}, "failed", True),
        ({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, "failed", True),
        ({"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed"}, "failed", False),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, "failed", True),
    ],
)
def test_rayjob_status_maps_to_phase(status: dict[str, str], phase: str, retryable: bool) -> None:
    result = submit.rayjob_phase({"status": status})
    assert (result["phase"], result["retryable"]) == (phase, retryable)


def test_rayjob_names_are_dns_labels() -> None:
    name = submit.rayjob_name("LLM_Batch." + "x" * 80, "2026-11-28", 12)
    assert len(name) <= 63 and name.endswith("-2026-11-28-a12")
    assert name == name.lower() and "_" not in name and "." not in name
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        submit.rayjob_name("p", "28/11/2026", 1)
    with pytest.raises(ValueError, match="attempt"):
        submit.rayjob_name("p", "2026-11-28", 0)


def test_uris_are_quoted_and_must_be_s3(tmp_path: Path) -> None:
    settings = submit.Settings.from_env(_env_without_server(tmp_path))
    odd_input, odd_output = "s3://b/in put/", "s3://b/out;rm -rf/"
    manifest = submit.build_rayjob(TEMPLATE, settings, "n", odd_input, odd_output, "2026-11-28")
    assert manifest["spec"]["entrypoint"].endswith("--input 's3://b/in put/' --output 's3://b/out;rm -rf/'")
    assert TEMPLATE["spec"]["entrypoint"].endswith("job.yaml"), "the template itself is left alone"
    with pytest.raises(ValueError, match="input_uri must be an s3:// URI"):
        submit.build_rayjob(TEMPLATE, settings, "n", "/local/in", "s3://b/out/", "2026-11-28")
    with pytest.raises(ValueError, match=r"RayJob with spec\.entrypoint"):
        submit.build_rayjob({"kind": "RayCluster"}, settings, "n", "s3://b/i/", "s3://b/o/", "2026-11-28")


def _env_without_server(tmp_path: Path) -> dict[str, str]:
    return {
        "CLUSTER_NAME": CLUSTER,
        "API_SERVER": "https://10.0.0.1",
        "CLUSTER_CA": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode(),
        "NAMESPACE": NAMESPACE,
        "NAME_PREFIX": "llm-batch-medium",
        "CAPACITY_MODE": "nodegroup",
        "NODEGROUP": NODEGROUP,
        "GPU_NODES": "2",
        "AWS_REGION": "us-east-1",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"API_SERVER": ""}, "API_SERVER is not set"),
        ({"API_SERVER": "http://10.0.0.1"}, "https://"),
        ({"CLUSTER_CA": "not base64!"}, "CLUSTER_CA is not base64"),
        ({"CAPACITY_MODE": "fargate"}, "'nodegroup' or 'karpenter'"),
        ({"GPU_NODES": "0"}, "GPU_NODES >= 1"),
        ({"GPU_NODES": "two"}, "GPU_NODES must be an integer"),
        ({"CAPACITY_MODE": "karpenter"}, "KARPENTER_NODEPOOL"),
    ],
)
def test_a_bad_environment_is_named(change: dict[str, str], message: str, tmp_path: Path) -> None:
    with pytest.raises(submit.ConfigError, match=message):
        submit.Settings.from_env({**_env_without_server(tmp_path), **change})


def test_an_unknown_action_is_named() -> None:
    with pytest.raises(ValueError, match="unknown action 'scale'"):
        submit.handler({"action": "scale"})
