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

from infra import nightly_template
from infra.config import StackConfig, decode_pulumi_values, load_stack_config
from infra.config.worker_groups import gpu_node_pool_names
from infra.eks_job import base_rayjob_args
from infra.functions.submit_rayjob import handler as submit
from infra.ops.stacks import offline_config, read_stack_config
from tests.infra.fake_kube import FakeKube, self_signed_cert
from workload.contract.config import build_config

NAMESPACE = "llm-batch"
RAYJOBS = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayjobs"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
CLUSTER = "llm-batch-medium"
NODEGROUP = "llm-batch-medium-gpu-spot"

BUCKET = "llm-batch-medium-data"
INPUT_URI = f"s3://{BUCKET}/input/2026-11-28/"
OUTPUT_URI = f"s3://{BUCKET}/output/2026-11-28/"


def stack_config(stack: str) -> StackConfig:
    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def template_for(stack: str, bucket: str = BUCKET) -> list[dict[str, Any]]:
    """What the program packages with the function: the stack's real nightly RayJob, rendered by infra/k8s."""
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-batch:0.1.0"
    base = base_rayjob_args(stack_config(stack), stack, image, bucket)
    return json.loads(nightly_template.night_template_json(base))


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


def _env(kube: FakeKube, tmp_path: Path, stack: str = "medium", **extra: str) -> dict[str, str]:
    template = tmp_path / "night_template.json"
    template.write_text(json.dumps(template_for(stack)))
    return {
        "CLUSTER_NAME": CLUSTER,
        "API_SERVER": kube.url,
        "CLUSTER_CA": base64.b64encode(kube.ca_pem.encode()).decode(),
        "NAMESPACE": NAMESPACE,
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
    eks.create_cluster(name=CLUSTER, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": []})
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
        "input_uri": INPUT_URI,
        "output_uri": OUTPUT_URI,
    }


def test_a_night_on_a_node_group_tier(
    kube: FakeKube, nodegroup: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crds_dir: Path
) -> None:
    for key, value in _env(kube, tmp_path).items():
        monkeypatch.setenv(key, value)

    assert "node group" in submit.handler({"action": "capacity_up"})["capacity"]
    assert _desired(nodegroup) == 2

    first = submit.handler(_run_event(attempt=1))
    assert first["name"] == "llm-batch-20261128-a1"
    manifest = kube.objects[f"{RAYJOBS}/{first['name']}"]
    jsonschema.validate(manifest, _rayjob_schema(crds_dir))
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llm-batch-nightly"
    (config_map,) = kube.names(CONFIGMAPS)
    job = build_config(yaml.safe_load(kube.objects[f"{CONFIGMAPS}/{config_map}"]["data"]["job.yaml"]))
    assert (job.input.uri, job.output.uri) == (INPUT_URI, OUTPUT_URI)
    # The head mounts this night's ConfigMap, not the template's.
    assert config_map in json.dumps(manifest["spec"]["rayClusterSpec"]["headGroupSpec"])
    assert "nightlyrunid" not in json.dumps(manifest) and "{date}" not in json.dumps(manifest)
    # Every call carried an EKS bearer token.
    assert all(auth.startswith("Bearer k8s-aws-v1.") for _, _, auth in kube.requests)

    assert submit.handler({"action": "status", "name": first["name"]})["phase"] == "running"
    manifest["status"] = {"jobDeploymentStatus": "Failed", "jobStatus": "", "reason": "SubmissionFailed"}
    status = submit.handler({"action": "status", "name": first["name"]})
    assert status["phase"] == "failed" and status["retryable"] is True

    # The retry replaces the first attempt: one driver per output.
    second = submit.handler(_run_event(attempt=2))
    assert second == {"name": "llm-batch-20261128-a2", "removed": [first["name"]]}
    assert kube.names(RAYJOBS) == [second["name"]]
    assert kube.names(CONFIGMAPS) == [f"{second['name']}-config"]
    # A retried invocation (Step Functions' Retry after a timeout) finds it created and carries on.
    assert submit.handler(_run_event(attempt=2))["name"] == second["name"]

    released = submit.handler({"action": "release"})
    assert released["deleted_rayjobs"] == [second["name"]]
    assert kube.names(RAYJOBS) == [] and kube.names(CONFIGMAPS) == []
    assert _desired(nodegroup) == 0
    # Releasing twice (the sweep after a run) is harmless.
    assert submit.handler({"action": "release"})["deleted_rayjobs"] == []


def test_release_on_a_karpenter_tier_deletes_the_gpu_nodeclaims(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    """Every GPU NodePool of the large stack (one-GPU and eight-GPU workers, Spot and on-demand fallback), as the
    program sets KARPENTER_NODEPOOL, is emptied; the system pool is not."""
    pools = ",".join(gpu_node_pool_names(offline_config("large").eks))
    assert pools == "gpu-spot,gpu-on-demand,gpu8-spot,gpu8-on-demand"
    env = _env(kube, tmp_path, "large", CAPACITY_MODE="karpenter", KARPENTER_NODEPOOL=pools, NODEGROUP="")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    claims = [("gpu-a", "gpu-spot"), ("gpu-b", "gpu-on-demand"), ("gpu8-a", "gpu8-spot"), ("gpu8-b", "gpu8-on-demand")]
    for name, pool in (*claims, ("system-a", "system")):
        kube.put(submit.NODECLAIMS, {"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool}}})
    assert "Karpenter" in submit.handler({"action": "capacity_up"})["capacity"]
    submit.handler(_run_event())
    released = submit.handler({"action": "release"})
    assert released["deleted_rayjobs"] == ["llm-batch-20261128-a1"]
    assert kube.names(submit.NODECLAIMS) == ["system-a"]
    assert "4 NodeClaim(s)" in released["capacity"]


def test_a_rayjob_that_vanished_counts_as_a_retryable_failure(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    for key, value in _env(kube, tmp_path).items():
        monkeypatch.setenv(key, value)
    status = submit.handler({"action": "status", "name": "llm-batch-20261128-a1"})
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


def test_night_objects_take_the_date_and_attempt() -> None:
    objects = submit.night_objects(template_for("medium"), "2026-11-28", 12, OUTPUT_URI)
    assert [obj["kind"] for obj in objects] == ["ConfigMap", "RayJob"]
    assert objects[-1]["metadata"]["name"] == "llm-batch-20261128-a12"
    assert len(objects[-1]["metadata"]["name"]) <= 47, "KubeRay's limit for a RayJob name"
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        submit.night_objects(template_for("medium"), "28/11/2026", 1, OUTPUT_URI)
    with pytest.raises(ValueError, match="attempt"):
        submit.night_objects(template_for("medium"), "2026-11-28", 0, OUTPUT_URI)


def test_a_batchs_objects_run_on_its_file_and_output_under_its_own_name() -> None:
    """The eks machine's PlanBatch passes its run: the RayJob is named for the batch and its entrypoint gets the
    batch's file and output, which the job puts over its config's."""
    batch_id = "batch_" + "0123456789abcdef01234567"
    out = "s3://llm-batch-medium-data/batch-api/batches/" + batch_id + "/output"
    run = {
        "batch_id": batch_id,
        "input_uri": "s3://llm-batch-medium-data/batch-api/files/file-1.jsonl",
        "output_uri": out,
    }
    objects = submit.night_objects(template_for("medium"), "2026-12-02", 2, out, run)
    rayjob = objects[-1]
    assert rayjob["metadata"]["name"] == "llm-batch-batch-0123456789abcdef01234567-a2"
    assert len(rayjob["metadata"]["name"]) <= 47, "KubeRay's limit for a RayJob name"
    # Without the night's job.image_prefix: the operator's images are no tenant's.
    assert rayjob["spec"]["entrypoint"].endswith(f"--input {run['input_uri']} --output {out} --no-image-prefix")
    with pytest.raises(ValueError, match="batch_<24 hex>"):
        submit.night_objects(template_for("medium"), "2026-12-02", 1, out, {**run, "batch_id": "batch_x; rm"})
    with pytest.raises(ValueError, match="the watched output"):
        submit.night_objects(template_for("medium"), "2026-12-02", 1, out, {**run, "output_uri": "s3://x/y"})


def test_night_objects_refuse_an_output_the_state_machine_does_not_watch() -> None:
    with pytest.raises(ValueError, match=r"does not write to s3://elsewhere/output/2026-11-28/"):
        submit.night_objects(template_for("medium"), "2026-11-28", 1, "s3://elsewhere/output/2026-11-28/")


def test_night_objects_refuse_a_template_of_the_wrong_shape() -> None:
    template = template_for("medium")
    with pytest.raises(ValueError, match="ConfigMaps then one RayJob"):
        submit.night_objects(template[:1], "2026-11-28", 1, OUTPUT_URI)
    with pytest.raises(ValueError, match="run id marker"):
        submit.night_objects(json.loads(json.dumps(template).replace("nightlyrunid", "x")), "2026-11-28", 1, OUTPUT_URI)


def test_the_marker_is_the_same_on_both_sides() -> None:
    assert submit.RUN_ID_MARKER == nightly_template.RUN_ID_MARKER


def _env_without_server(tmp_path: Path) -> dict[str, str]:
    return {
        "CLUSTER_NAME": CLUSTER,
        "API_SERVER": "https://10.0.0.1",
        "CLUSTER_CA": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode(),
        "NAMESPACE": NAMESPACE,
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
