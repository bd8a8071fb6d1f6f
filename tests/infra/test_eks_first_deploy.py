"""What the medium and large tiers' first `pulumi up` needs beyond what mocks accept (issue 13).

The route to the API server during deploy, a head group that holds what runs on it, Karpenter's subnet
discovery tag owned by the Subnet, and Karpenter's instance-profile listing on "*". The order rules have
their own file (tests/infra/test_checks_order.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra import deploy_route
from infra.config import StackConfigError, load_stack_config
from infra.eks_job import base_rayjob_args, manifests_for_date
from infra.k8s import head_group
from infra.k8s.head_group import (
    SYSTEM_NODES,
    HeadPod,
    RayHead,
    Requests,
    head_group_shortfall,
    pods_on_head_group,
    pods_on_system_group,
)
from infra.k8s.instance_types import InstanceShape, shape_of
from infra.k8s.karpenter import DISCOVERY_TAG
from infra.ops.plan import run_under_mocks
from infra.ops.stacks import ROOT
from infra.rules import iam_allowlist, registry
from tests.infra.crd_schema import assert_valid

Plan = list[dict[str, Any]]
CIDRS = ["203.0.113.7/32", "198.51.100.0/28"]


def _eks(tier: str, **eks: Any) -> Any:
    return load_stack_config(tier, {"cost_center": "ml", "eks": eks})


def _one(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and item["name"] == name]
    assert len(found) == 1, f"expected one {type_token} {name}, found {len(found)}"
    return found[0]


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


# --- 2. a route to the API server -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cidrs",
    [
        ["0.0.0.0/0"],
        ["0.0.0.0/1", "128.0.0.0/1"],  # each half alone is "only" half the internet; together it is all of it
        ["10.0.0.0/8", "11.0.0.0/8"],  # two /8s: more than the most a deployer's ranges add up to
    ],
)
def test_endpoint_cidrs_that_together_open_the_api_are_refused(cidrs: list[str]) -> None:
    with pytest.raises(StackConfigError, match=r"llm-batch:eks.endpoint_public_access_cidrs: .*opens the API"):
        _eks("medium", endpoint_public_access_cidrs=cidrs)


def test_endpoint_cidrs_are_ipv4_and_a_deployer_s_ranges_pass() -> None:
    with pytest.raises(StackConfigError, match="IPv4 CIDR blocks only"):
        _eks("medium", endpoint_public_access_cidrs=["2001:db8::/32"])
    assert _eks("large", endpoint_public_access_cidrs=CIDRS).eks.endpoint_public_access_cidrs == CIDRS
    assert _eks("large", endpoint_public_access_cidrs=["100.0.0.0/8"])  # a /8 in all is the most allowed


def test_no_route_is_named_by_its_key_only_where_a_cluster_is_deployed() -> None:
    problem = deploy_route.route_problem(_eks("large"))
    assert problem is not None and "\n" not in problem
    assert "set llm-batch:eks.endpoint_public_access_cidrs to the public CIDR" in problem
    assert deploy_route.route_problem(_eks("large", endpoint_public_access_cidrs=CIDRS)) is None
    assert deploy_route.route_problem(load_stack_config("small", {"cost_center": "ml"})) is None


def test_a_real_up_raises_a_run_error_and_a_preview_or_plan_only_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _eks("medium")
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", warned.append)
    with pytest.raises(pulumi.RunError, match=r"^no route from this deploy .*endpoint_public_access_cidrs"):
        deploy_route.require_route(config, offline=False, dry_run=False)
    assert warned == []
    for offline, dry_run in ((True, False), (False, True)):
        deploy_route.require_route(config, offline=offline, dry_run=dry_run)
    assert len(warned) == 2 and all("endpoint_public_access_cidrs" in line for line in warned)


def test_the_program_knows_the_offline_plan_from_a_real_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    run_under_mocks(lambda: seen.append(deploy_route.under_offline_plan()), stack="test")
    assert seen == [True]
    # A real engine hands the program a gRPC stub of its resource monitor, never the SDK's mock monitor.
    import grpc
    from pulumi.runtime import settings
    from pulumi.runtime.proto import resource_pb2_grpc

    channel = grpc.insecure_channel("127.0.0.1:9")  # never dialled: creating a stub does not connect
    monkeypatch.setattr(settings.SETTINGS, "monitor", resource_pb2_grpc.ResourceMonitorStub(channel))
    assert deploy_route.under_offline_plan() is False
    channel.close()


_REAL_UP_WITHOUT_ROUTE = """
import json
from infra import deploy_route
from infra.ops import plan
from infra.ops.plan_mocks import PlanMocks

deploy_route.under_offline_plan = lambda: False  # as under `pulumi up`: a real engine, not the mocks
created = []
mocks = PlanMocks(region="us-east-1")
new_resource = mocks.new_resource
mocks.new_resource = lambda args: (created.append(args.typ), new_resource(args))[1]
try:
    plan.run_program("medium", mocks=mocks)
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error), "created": created}))
"""


def test_a_real_up_without_a_route_stops_before_creating_anything() -> None:
    """The committed medium stack, run as `pulumi up` would (dry_run off, not the offline plan)."""
    result = _run(_REAL_UP_WITHOUT_ROUTE)
    assert result.stdout.strip(), result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["error"] == "RunError"
    assert outcome["message"].count("\n") == 0 and "llm-batch:eks.endpoint_public_access_cidrs" in outcome["message"]
    assert outcome["created"] == []


def test_the_committed_stacks_still_plan_and_warn_naming_the_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "infra.plan", "medium", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "endpoint_public_access_cidrs" in line]
    assert len(warnings) == 1 and warnings[0].startswith("no route from this deploy to the EKS API server")


_EXISTING_VPC_WITH_ROUTE = """
import json, sys
from pathlib import Path
from infra.ops import plan, stacks
stacks.STACKS_DIR = Path(sys.argv[1])
json.dump(plan.run_program("edge"), sys.stdout, default=str)
"""


@pytest.fixture(scope="module")
def large_in_existing_vpc(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, str]:
    """The large tier in an existing VPC, deployed from two CIDRs: its plan and the plan's stderr."""
    folder = tmp_path_factory.mktemp("stacks")
    config = {
        "llm-batch:tier": "large",
        "llm-batch:cost_center": "ml",
        "llm-batch:network": {
            "existing_vpc_id": "vpc-0abc",
            "existing_private_subnet_ids": ["subnet-01", "subnet-02", "subnet-03"],
        },
        "llm-batch:eks": {"endpoint_public_access_cidrs": CIDRS},
    }
    (folder / "Pulumi.edge.yaml").write_text(yaml.safe_dump({"config": config}))
    result = subprocess.run(
        [sys.executable, "-c", _EXISTING_VPC_WITH_ROUTE, str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), result.stderr


def test_with_deployer_cidrs_the_endpoint_is_public_for_them_and_private_for_the_rest(
    large_in_existing_vpc: tuple[Plan, str],
) -> None:
    plan, stderr = large_in_existing_vpc
    cluster = _one(plan, "eks:index:Cluster", "eks-cluster")["inputs"]
    assert cluster["endpointPublicAccess"] is True and cluster["publicAccessCidrs"] == CIDRS
    assert cluster["endpointPrivateAccess"] is True  # nodes and the nightly run stay inside the VPC
    assert "endpoint_public_access_cidrs" not in stderr


# --- 3. a head group that holds what runs on it ------------------------------------------------------------


def _names(pods: list[HeadPod]) -> set[str]:
    return {pod.name for pod in pods}


def test_the_system_node_holds_the_operators_and_the_head_pool_only_ray_heads() -> None:
    """Between runs only the system node is up: CoreDNS and the operators live there, never on a head node (they
    would keep it from scaling back to 0); the head pool holds each Ray head and its company."""
    large, medium = _eks("large").eks, _eks("medium").eks
    system = {"coredns", "kube-proxy", "aws-node", "kuberay-operator"}
    assert _names(pods_on_system_group(karpenter=True)) == system | {"karpenter"}
    assert _names(pods_on_system_group(karpenter=False)) == system | {"cluster-autoscaler"}
    daemons = {"kube-proxy", "aws-node"}
    ray = {"nightly RayJob ray head", "nightly RayJob submitter"}
    assert _names(pods_on_head_group(large.ray_heads)) == _names(pods_on_head_group(medium.ray_heads)) == daemons | ray
    # Ray autoscales in the large tier only: its head pod carries KubeRay's autoscaler sidecar.
    (head,) = [pod for pod in pods_on_head_group(large.ray_heads) if pod.name.endswith("ray head")]
    assert head.requests == Requests(cpu="2500m", memory="8704Mi")


def test_the_system_node_fits_its_pods_and_a_smaller_one_is_refused() -> None:
    t3_medium = shape_of("t3.medium")
    assert head_group_shortfall(pods_on_system_group(karpenter=True), t3_medium, SYSTEM_NODES) is None
    # A 2 vCPU / 1 GiB node (t3.micro's shape) cannot hold Karpenter's 1 GiB beside CoreDNS and KubeRay.
    shortfall = head_group_shortfall(pods_on_system_group(karpenter=True), InstanceShape(2, 1, 0), SYSTEM_NODES)
    assert shortfall is not None and "karpenter" in shortfall


def test_the_head_node_holds_the_ray_head_and_even_kuberay_s_default_submitter() -> None:
    """Before issue 40 the operators shared the head node and KubeRay's default submitter (500m, 200Mi) overcommitted
    it; the project's small template is kept, and now either fits the m5.xlarge."""
    large = _eks("large").eks
    pods = pods_on_head_group(large.ray_heads)
    m5_xlarge = shape_of("m5.xlarge")
    assert head_group_shortfall(pods, m5_xlarge, 1) is None
    default = [
        HeadPod(pod.name, Requests(cpu="500m", memory="200Mi")) if pod.name.endswith("submitter") else pod
        for pod in pods
    ]
    assert head_group_shortfall(default, m5_xlarge, 1) is None
    # Add the operators back, as before issue 40, and the default submitter overcommits it.
    before = [*default, *(pod for pod in pods_on_system_group(karpenter=True) if not pod.per_node)]
    shortfall = head_group_shortfall(before, m5_xlarge, 1)
    assert shortfall is not None and "hold 3.795 CPU" in shortfall


def test_a_head_type_the_pods_overflow_is_refused_naming_the_key() -> None:
    # The head pod (3.2 CPU + the 500m autoscaler sidecar) and the submitter fit no m5.xlarge together.
    with pytest.raises(StackConfigError, match=r"llm-batch:eks: .*eks.head_instance_type m5.xlarge x eks.head_nodes 1"):
        _eks("large", head_size={"cpu": "3200m", "memory": "8Gi"})
    # A second head node holds the overflow; a larger type does too.
    assert _eks("large", head_size={"cpu": "3200m", "memory": "8Gi"}, head_nodes=2)
    assert _eks("large", head_size={"cpu": "3200m", "memory": "8Gi"}, head_instance_type="m5.2xlarge")


def test_another_ray_head_is_one_more_entry_and_counts() -> None:
    large = _eks("large").eks
    serving = RayHead("serving", Requests(cpu="1500m", memory="4Gi"), autoscaler=False, submitter=False)
    pods = pods_on_head_group([*large.ray_heads, serving])
    assert "serving ray head" in _names(pods)
    assert head_group_shortfall(pods, shape_of("m5.xlarge"), 1) is not None
    assert head_group_shortfall(pods, shape_of("m5.2xlarge"), 1) is None


def test_the_rayjob_s_submitter_runs_small_on_the_head_nodes(crds_dir: Path) -> None:
    config = _eks("large")
    _, rayjob = manifests_for_date(base_rayjob_args(config, "large", "r.example/llm:1", "bucket"), "2026-11-29")
    assert_valid(rayjob, crds_dir)
    template = rayjob["spec"]["submitterPodTemplate"]["spec"]
    (container,) = template["containers"]
    assert container["resources"] == {
        "requests": head_group.RAYJOB_SUBMITTER.as_dict(),
        "limits": head_group.RAYJOB_SUBMITTER.as_dict(),
    }
    assert template["restartPolicy"] == "Never" and template["nodeSelector"] == {"llm-batch.io/pool": "head"}
    assert container["image"] == "r.example/llm:1" and template["securityContext"]["runAsNonRoot"] is True


def test_the_charts_ask_for_what_the_head_group_sum_counts(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("large")
    charts = {item["name"]: item["inputs"]["values"] for item in plan if item["type"] == "kubernetes:helm.sh/v4:Chart"}
    assert charts["karpenter-chart"]["controller"]["resources"]["requests"] == head_group.KARPENTER_CONTROLLER.as_dict()
    assert charts["kuberay-operator"]["resources"]["requests"] == head_group.KUBERAY_OPERATOR.as_dict()


# --- 4. Karpenter's discovery tag, owned by the subnets the program creates ---------------------------------


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_no_ec2_tag_on_a_resource_whose_tags_the_plan_owns(plan_for: Callable[[str], Plan], stack: str) -> None:
    """The next `up` would strip it: the owning resource sets its whole tag set."""
    plan = plan_for(stack)
    owned = {item["id"]: item["name"] for item in plan if item.get("custom") and registry.is_taggable(item["type"])}
    tags = [item for item in plan if item["type"] == "aws:ec2/tag:Tag"]
    assert [
        (tag["name"], owned[tag["inputs"]["resourceId"]]) for tag in tags if tag["inputs"]["resourceId"] in owned
    ] == []


def test_subnets_the_large_tier_creates_carry_the_discovery_tag_themselves(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("large")
    subnets = [item for item in plan if item["type"] == "aws:ec2/subnet:Subnet"]
    private = {item["name"]: item["inputs"]["tags"].get(DISCOVERY_TAG) for item in subnets if "private" in item["name"]}
    assert private == {f"network-private-{index}": "llm-batch-large" for index in range(3)}
    assert all(DISCOVERY_TAG not in item["inputs"]["tags"] for item in subnets if "public" in item["name"])
    (sg_tag,) = [item for item in plan if item["type"] == "aws:ec2/tag:Tag"]
    assert (
        sg_tag["inputs"]["resourceId"]
        == _one(plan, "eks:index:Cluster", "eks-cluster")["outputs"]["clusterSecurityGroupId"]
    )


def test_an_existing_vpc_s_subnets_get_the_tag_as_ec2_tags(large_in_existing_vpc: tuple[Plan, str]) -> None:
    plan, _ = large_in_existing_vpc
    tagged = {item["inputs"]["resourceId"] for item in plan if item["type"] == "aws:ec2/tag:Tag"}
    assert {"subnet-01", "subnet-02", "subnet-03"} < tagged
    assert not [item for item in plan if item["type"] == "aws:ec2/subnet:Subnet"]


# --- 5. Karpenter lists instance profiles on "*" -------------------------------------------------------------


def test_karpenter_lists_instance_profiles_on_star_and_the_allowlist_says_why(
    plan_for: Callable[[str], Plan], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_for("large")
    document = json.loads(
        _one(plan, "aws:iam/rolePolicy:RolePolicy", "karpenter-controller-policy")["inputs"]["policy"]
    )
    statements = {statement["Sid"]: statement for statement in document["Statement"]}
    assert statements["ListInstanceProfiles"]["Action"] == "iam:ListInstanceProfiles"
    assert statements["ListInstanceProfiles"]["Resource"] == "*"
    assert statements["ReadInstanceProfiles"]["Action"] == "iam:GetInstanceProfile"  # still scoped
    assert "instance-profile/*" in statements["ReadInstanceProfiles"]["Resource"]
    assert "only on Resource *" in iam_allowlist.RESOURCE_STAR_ACTIONS["iam:ListInstanceProfiles"]
    assert registry.check_iam(plan) == []
    # Without its allowlist entry the IAM check refuses the statement: the entry is what admits it.
    monkeypatch.delitem(iam_allowlist.RESOURCE_STAR_ACTIONS, "iam:ListInstanceProfiles")
    assert any("ListInstanceProfiles" in str(violation) for violation in registry.check_iam(plan))
