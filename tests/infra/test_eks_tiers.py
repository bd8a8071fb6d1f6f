"""The medium and large tiers as planned from their stack files, and the RayJob each submits."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import naming, versions
from infra.aws_context import AwsContext
from infra.components.image import WorkloadImageArgs
from infra.config import StackConfigError, decode_pulumi_values, load_stack_config
from infra.eks_job import base_rayjob_args, manifests_for_date, night_manifests
from infra.k8s.karpenter import DISCOVERY_TAG
from infra.k8s.rayjob import RayJobArgs, render_rayjob
from infra.ops.plan_mocks import ACCOUNT_ID
from infra.ops.stacks import ROOT, read_stack_config
from tests.infra.crd_schema import assert_valid

EKS_COMPONENTS = {
    "llmbatch:eks_cluster:EksCluster",
    "llmbatch:node_groups:NodeGroups",
    "llmbatch:job_identity:JobIdentity",
    "llmbatch:kuberay:KubeRayOperator",
    "llmbatch:device_plugin:NvidiaDevicePlugin",
}


def _types(plan: list[dict[str, Any]]) -> set[str]:
    return {item["type"] for item in plan}


def test_medium_has_a_managed_spot_gpu_group_and_the_cluster_autoscaler(plan_for) -> None:
    plan = plan_for("medium")
    assert _types(plan) >= EKS_COMPONENTS | {"llmbatch:cluster_autoscaler:ClusterAutoscaler"}
    assert "llmbatch:karpenter:Karpenter" not in _types(plan)
    groups = {item["name"]: item["inputs"] for item in plan if item["type"] == "eks:index:ManagedNodeGroup"}
    assert groups["nodes-gpu"]["capacityType"] == "SPOT"
    assert groups["nodes-gpu"]["instanceTypes"] == ["g5.2xlarge"]
    assert groups["nodes-gpu"]["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 2}
    assert groups["nodes-head"]["instanceTypes"] == ["m5.xlarge"]
    # The head group scales from 0 (the cluster autoscaler grows it for a Pending Ray head); only the system node
    # runs all month.
    assert groups["nodes-head"]["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 1}
    assert groups["nodes-system"]["scalingConfig"]["minSize"] == 1
    assert groups["nodes-system"]["instanceTypes"] == ["t3.medium"]
    # Every group joins the stack's cluster (the reference is recorded as the cluster's URN).
    (cluster,) = [item for item in plan if item["type"] == "eks:index:Cluster"]
    assert {group["cluster"] for group in groups.values()} == {cluster["urn"]}


def test_large_has_karpenter_instead_of_a_gpu_group(plan_for, crds_dir: Path) -> None:
    plan = plan_for("large")
    assert _types(plan) >= EKS_COMPONENTS | {"llmbatch:karpenter:Karpenter"}
    assert "llmbatch:cluster_autoscaler:ClusterAutoscaler" not in _types(plan)
    # The managed groups are the system node's alone: Karpenter makes the head nodes (its `head` NodePool, from 0)
    # and the GPU nodes.
    groups = [item["name"] for item in plan if item["type"] == "eks:index:ManagedNodeGroup"]
    assert groups == ["nodes-system"]
    custom = [item for item in plan if item["type"].startswith("kubernetes:karpenter")]
    assert sorted(item["inputs"]["kind"] for item in custom) == ["EC2NodeClass", "NodePool", "NodePool"]
    pools = {item["inputs"]["metadata"]["name"] for item in custom if item["inputs"]["kind"] == "NodePool"}
    assert "head" in pools
    for item in custom:
        assert_valid(item["inputs"], crds_dir)
    # Karpenter's discovery tag: in the own tags of the three private subnets the program creates, and as an
    # ec2.Tag on the cluster security group EKS creates (tests/infra/test_eks_first_deploy.py).
    private = [item for item in plan if item["type"] == "aws:ec2/subnet:Subnet" and "private" in item["name"]]
    assert len(private) == 3 and all(item["inputs"]["tags"][DISCOVERY_TAG] == "llm-batch-large" for item in private)
    assert [item["name"] for item in plan if item["type"] == "aws:ec2/tag:Tag"] == ["karpenter-sg-discovery"]


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_cluster_is_private_and_named_after_the_stack(plan_for, stack: str) -> None:
    (cluster,) = [item for item in plan_for(stack) if item["type"] == "eks:index:Cluster"]
    assert cluster["inputs"]["name"] == naming.prefix(stack)
    assert cluster["inputs"]["endpointPublicAccess"] is False
    assert cluster["inputs"]["endpointPrivateAccess"] is True
    (vpc,) = [item for item in plan_for(stack) if item["type"] == "aws:ec2/vpc:Vpc"]
    assert cluster["inputs"]["vpcId"] == vpc["id"]


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_every_kubernetes_object_goes_to_the_new_cluster(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    (provider,) = [item for item in plan if item["type"] == "pulumi:providers:kubernetes"]
    objects = [item for item in plan if item["type"].startswith("kubernetes:")]
    assert objects
    assert {item["provider"] for item in objects} == {provider["urn"]}


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_every_launch_template_is_imdsv2_encrypted_and_cost_tagged(plan_for, stack: str) -> None:
    templates = [item for item in plan_for(stack) if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    assert templates
    for template in templates:
        inputs = template["inputs"]
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert all(device["ebs"]["encrypted"] == "true" for device in inputs["blockDeviceMappings"])
        for spec in inputs["tagSpecifications"]:
            assert set(naming.COST_TAG_KEYS) <= set(spec["tags"])


def _stack_config(stack: str) -> Any:
    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def _base_args(stack: str) -> RayJobArgs:
    config = _stack_config(stack)
    context = AwsContext(account_id=ACCOUNT_ID, partition="aws", region=config.region, dns_suffix="amazonaws.com")
    built = WorkloadImageArgs(stack=stack, key_arn="", keep_last_images=1, repository_name=config.image.repository_name)
    image = f"{context.ecr_registry}/{built.repository}:{built.tag}"
    return base_rayjob_args(config, stack, image, "llm-batch-data-bucket")


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_each_tiers_nightly_rayjob_matches_the_crd(stack: str, crds_dir: Path) -> None:
    base = _base_args(stack)
    assert_valid(render_rayjob(base), crds_dir)
    config_map, rayjob = night_manifests(
        base,
        run_id="20261129",
        input_uri="s3://llm-batch-data-bucket/input/2026-11-29/",
        output_uri="s3://llm-batch-data-bucket/output/2026-11-29/",
    )
    assert_valid(rayjob, crds_dir)
    assert config_map["kind"] == "ConfigMap" and rayjob["metadata"]["name"] == "llm-batch-20261129"


def test_tier_rayjobs_differ_where_the_tiers_do() -> None:
    medium, large = _base_args("medium"), _base_args("large")
    assert (medium.autoscaling, medium.workers.min_replicas, medium.workers.max_replicas) == (False, 2, 2)
    assert (large.autoscaling, large.workers.min_replicas, large.workers.max_replicas) == (True, 1, 8)
    assert (medium.job.replicas, large.job.replicas) == (2, 8)
    assert not medium.protect_from_consolidation and large.protect_from_consolidation
    for args in (medium, large):
        assert args.job.device == "gpu"
        assert args.job.metrics.sink == "cloudwatch"
        assert args.job.metrics.log_group == naming.job_log_group(args.labels["llm-batch.io/stack"])
        assert ":ctx-" in args.image and ".dkr.ecr." in args.image
        assert args.active_deadline_s == 360 * 60


def test_a_date_fills_the_prefixes_and_names_the_run(crds_dir: Path) -> None:
    config_map, rayjob = manifests_for_date(_base_args("medium"), "2026-11-29")
    assert_valid(rayjob, crds_dir)
    assert rayjob["metadata"]["name"] == "llm-batch-2026-11-29"
    job = yaml.safe_load(config_map["data"]["job.yaml"])
    assert job["input"]["uri"] == "s3://llm-batch-data-bucket/input/2026-11-29/"
    assert job["output"]["uri"] == "s3://llm-batch-data-bucket/output/2026-11-29/"
    assert job["metrics"]["run_id"] == "2026-11-29"
    with pytest.raises(ValueError, match="must be YYYY-MM-DD"):
        manifests_for_date(_base_args("medium"), "29/11/2026")


def test_ray_version_matches_the_job_image_pin() -> None:
    """KubeRay configures the cluster for `rayVersion`; it must be the Ray the image installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [dep for dep in project["dependencies"] if dep.startswith("ray[")]
    assert pin.split("==")[1] == versions.RAY_VERSION
    assert render_rayjob(_base_args("medium"))["spec"]["rayClusterSpec"]["rayVersion"] == versions.RAY_VERSION


def test_rayjob_args_travel_as_json() -> None:
    """The program exports the base args as JSON; the nightly submitter rebuilds exactly the same object."""
    base = _base_args("large")
    assert RayJobArgs.model_validate_json(base.model_dump_json()) == base


@pytest.mark.parametrize(
    ("eks", "message"),
    [
        (
            {"worker_size": {"cpu": "8", "memory": "24Gi", "gpus": 1}},
            "worker_size .* fits no node of gpu_instance_type",
        ),
        (
            {"head_size": {"cpu": "2", "memory": "15Gi"}},
            "eks.head_instance_type m5.xlarge .* nightly RayJob ray head .* fits no head node",
        ),
        ({"gpu_instance_type": "g5.huge"}, "unknown instance type 'g5.huge'"),
        ({"namespace": "Jobs!"}, "eks.namespace"),
        ({"node_pool": {"memory_limit": "1024Gi"}}, "p4d.24xlarge .* could never launch it"),
    ],
)
def test_bad_eks_config_names_the_key(eks: dict[str, Any], message: str) -> None:
    with pytest.raises(StackConfigError, match=message):
        load_stack_config("medium", {"cost_center": "ml", "eks": eks})


def test_large_worker_count_must_fit_the_pool_gpu_limit() -> None:
    with pytest.raises(StackConfigError, match=r"gpu_max_nodes x worker_size.gpus \(20\) is more than"):
        load_stack_config("large", {"cost_center": "ml", "eks": {"gpu_max_nodes": 20}})
    with pytest.raises(StackConfigError, match=r"gpu_min_workers \(9\) is more than gpu_max_nodes \(8\)"):
        load_stack_config("large", {"cost_center": "ml", "eks": {"gpu_min_workers": 9}})
    with pytest.raises(StackConfigError, match=r"worker_size .* fits no node of node_pool.instance_types"):
        load_stack_config(
            "large",
            {"cost_center": "ml", "eks": {"worker_size": {"cpu": "100", "memory": "12Gi", "gpus": 1}}},
        )
