"""The medium and large tiers as planned from their stack files, and the RayJob each submits."""

from __future__ import annotations

import json
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
    assert sorted(item["inputs"]["kind"] for item in custom) == ["EC2NodeClass", *["NodePool"] * 5]
    pools = {item["inputs"]["metadata"]["name"] for item in custom if item["inputs"]["kind"] == "NodePool"}
    # The head's, and each GPU worker group's Spot pool with its on-demand fallback (tests/infra/test_large_pools.py).
    assert pools == {"head", "gpu-spot", "gpu-on-demand", "gpu8-spot", "gpu8-on-demand"}
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
        ({"node_pool": {"instance_types": ["p4d.24xlarge"], "memory_limit": "1024Gi"}}, "p4d.24xlarge .* never launch"),
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


# --- the posture an idle stack keeps (issue 40: cheaper, nothing given up) ------------------------------------

INGRESS_TYPES = (
    "aws:ec2/securityGroupRule:SecurityGroupRule",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
)


def _items(plan: list[dict[str, Any]], type_token: str) -> list[dict[str, Any]]:
    return [item for item in plan if item["type"] == type_token]


@pytest.mark.parametrize("stack", ["small", "medium", "large"])
def test_every_stack_takes_nothing_in_from_the_internet_and_sends_only_https(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    (vpc,) = _items(plan, "aws:ec2/vpc:Vpc")
    groups = _items(plan, "aws:ec2/securityGroup:SecurityGroup")
    # No inbound from outside the VPC, in any group or standalone rule.
    for group in groups:
        for rule in group["inputs"].get("ingress") or []:
            assert rule.get("cidrBlocks", []) in ([], [vpc["inputs"]["cidrBlock"]]), group["name"]
            assert not rule.get("ipv6CidrBlocks"), group["name"]
    for rule in (item["inputs"] for item in plan if item["type"] in INGRESS_TYPES):
        if rule.get("type", "ingress") == "ingress":
            # From another group (the submitter's to the API) or the VPC, never a CIDR beyond it.
            cidrs = [*(rule.get("cidrBlocks") or []), *([rule["cidrIpv4"]] if rule.get("cidrIpv4") else [])]
            assert cidrs in ([], [vpc["inputs"]["cidrBlock"]]) and not rule.get("cidrIpv6"), rule
            assert cidrs or rule.get("referencedSecurityGroupId") or rule.get("sourceSecurityGroupId"), rule
    # Beyond the VPC only TCP 443 goes out.
    for group in groups:
        for rule in group["inputs"].get("egress") or []:
            assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 443, 443), group["name"]
    # Every default route: the internet gateway only from the public table, the nodes' tables through a NAT instance.
    for table in _items(plan, "aws:ec2/routeTable:RouteTable"):
        (route,) = table["inputs"]["routes"]
        assert route["cidrBlock"] == "0.0.0.0/0"
        key = "gatewayId" if table["name"] == "network-public" else "networkInterfaceId"
        assert set(route) == {"cidrBlock", key}, table["name"]
    # The nodes' route tables carry the S3 gateway endpoint (models, data and ECR's layers never take the NAT).
    (s3,) = _items(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")
    assert s3["inputs"]["vpcEndpointType"] == "Gateway" and s3["inputs"]["serviceName"].endswith(".s3")
    node_tables = {t["id"] for t in _items(plan, "aws:ec2/routeTable:RouteTable") if t["name"] != "network-public"}
    assert set(s3["inputs"]["routeTableIds"]) == (
        node_tables or {t["id"] for t in _items(plan, "aws:ec2/routeTable:RouteTable")}
    )
    # IMDSv2, hop limit 1 (the small tier's node 2: its job's container uses the instance role), on everything that
    # launches a machine: launch templates, the NAT instances, Karpenter's node class.
    for template in _items(plan, "aws:ec2/launchTemplate:LaunchTemplate"):
        assert template["inputs"]["metadataOptions"]["httpTokens"] == "required", template["name"]
    for instance in _items(plan, "aws:ec2/instance:Instance"):
        metadata = instance["inputs"]["metadataOptions"]
        assert (metadata["httpTokens"], metadata["httpPutResponseHopLimit"]) == ("required", 1), instance["name"]
        assert "keyName" not in instance["inputs"] and instance["inputs"]["rootBlockDevice"]["encrypted"] is True
    for node_class in _items(plan, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"):
        assert node_class["inputs"]["spec"]["metadataOptions"]["httpTokens"] == "required"
    assert len(_items(plan, "aws:ec2/instance:Instance")) == {"small": 0, "medium": 1, "large": 3}[stack]
    # Private API endpoint on the EKS tiers.
    for cluster in _items(plan, "eks:index:Cluster"):
        assert cluster["inputs"]["endpointPublicAccess"] is False and cluster["inputs"]["endpointPrivateAccess"]


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_between_runs_only_the_system_node_runs_and_it_holds_every_operator(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    groups = {item["name"]: item["inputs"] for item in _items(plan, "eks:index:ManagedNodeGroup")}
    always_on = {name for name, group in groups.items() if group["scalingConfig"]["minSize"] > 0}
    assert always_on == {"nodes-system"} and "taints" not in groups["nodes-system"]
    pools = {
        item["inputs"]["metadata"]["name"]: item["inputs"]
        for item in _items(plan, "kubernetes:karpenter.sh/v1:NodePool")
    }
    if stack == "medium":
        assert groups["nodes-head"]["scalingConfig"]["minSize"] == 0 and not pools
    else:
        assert "nodes-head" not in groups and pools["head"]["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    # Every other source of nodes is tainted: what tolerates none of the pools' taints (CoreDNS, which EKS deploys
    # tolerating only CriticalAddonsOnly and the control plane's taint) can run on the system node alone.
    tainted = [group.get("taints") for name, group in groups.items() if name != "nodes-system"]
    tainted += [pool["spec"]["template"]["spec"].get("taints") for pool in pools.values()]
    assert tainted and all(tainted)
    assert not {taint["key"] for taints in tainted for taint in taints} & {"CriticalAddonsOnly"}
    # And pinned there besides: the CoreDNS add-on's nodeSelector (its configuration schema), after the system node.
    (coredns,) = [item for item in _items(plan, "aws:eks/addon:Addon") if item["inputs"]["addonName"] == "coredns"]
    assert json.loads(coredns["inputs"]["configurationValues"]) == {"nodeSelector": {"llm-batch.io/pool": "system"}}
    assert coredns["inputs"]["clusterName"] == naming.prefix(stack)
    assert any(urn.endswith("::nodes-system") for urn in coredns["dependencies"])
    # The operators are pinned to the system node and tolerate no pool taint.
    charts = {item["name"]: item["inputs"]["values"] for item in _items(plan, "kubernetes:helm.sh/v4:Chart")}
    operators = ["kuberay-operator", "karpenter-chart" if stack == "large" else "cluster-autoscaler-chart"]
    for name in operators:
        assert charts[name]["nodeSelector"] == {"llm-batch.io/pool": "system"}, name
        assert "tolerations" not in charts[name], name


def test_the_cluster_autoscaler_can_grow_the_head_group_from_zero(plan_for) -> None:
    """With no node of a group to copy, the cluster autoscaler (1.24 and later) reads a managed group's labels and
    taints from EKS's DescribeNodegroup (its AWS README, "Auto-Discovery Setup" / scaling from 0); without that
    permission it would need the `k8s.io/cluster-autoscaler/node-template/label|taint/...` tags on the ASG, which a
    managed group's ASG does not get. The plan grants the call on this cluster's groups, runs an image of 1.24 or
    later, and the Ray head asks exactly for the head group's label and taint."""
    plan = plan_for("medium")
    (role_policy,) = [
        item for item in _items(plan, "aws:iam/rolePolicy:RolePolicy") if "cluster-autoscaler" in item["name"]
    ]
    statements = json.loads(role_policy["inputs"]["policy"])["Statement"]
    (describe,) = [s for s in statements if s["Action"] == "eks:DescribeNodegroup"]
    assert describe["Resource"] == f"arn:aws:eks:us-east-1:{ACCOUNT_ID}:nodegroup/llm-batch-medium/*/*"
    charts = {item["name"]: item["inputs"]["values"] for item in _items(plan, "kubernetes:helm.sh/v4:Chart")}
    major, minor = (int(part) for part in charts["cluster-autoscaler-chart"]["image"]["tag"].lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 24)
    (head,) = [item["inputs"] for item in _items(plan, "eks:index:ManagedNodeGroup") if item["name"] == "nodes-head"]
    ((key, value),) = head["labels"].items()
    (taint,) = head["taints"]
    config = load_stack_config("medium", {"cost_center": "cc"})
    rayjob = render_rayjob(base_rayjob_args(config, "medium", "r.example/llm:1", "bucket"))
    pod = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert pod["nodeSelector"] == {key: value}
    assert pod["tolerations"] == [
        {"key": taint["key"], "operator": "Equal", "value": taint["value"], "effect": "NoSchedule"}
    ]
