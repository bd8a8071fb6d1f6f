"""The EKS components one by one, under the plan's mocks (no Pulumi CLI, provider or AWS account here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra import versions
from infra.components.cluster_autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from infra.components.device_plugin import NvidiaDevicePlugin
from infra.components.eks_cluster import EksCluster, EksClusterArgs
from infra.components.job_identity import JobIdentity, JobIdentityArgs
from infra.components.karpenter import INTERRUPTION_EVENTS, Karpenter, KarpenterArgs
from infra.components.kuberay import KubeRayOperator
from infra.components.node_groups import NodeGroups, NodeGroupsArgs
from infra.k8s.common import GPU_TAINT_KEY, POOL_LABEL
from infra.k8s.karpenter import DISCOVERY_TAG, NodePoolArgs
from tests.infra.component_mocks import CONTEXT, Registrations, of_type, one, register
from tests.infra.crd_schema import assert_valid

KEY_ARN = f"arn:aws:kms:us-east-1:{CONTEXT.account_id}:key/11111111-2222-3333-4444-555555555555"
OIDC_URL = "oidc.eks.us-east-1.amazonaws.com/id/ABCDEF0123456789"
OIDC_ARN = f"arn:aws:iam::{CONTEXT.account_id}:oidc-provider/{OIDC_URL}"
TAGS = {"CostCenter": "ml", "Project": "llm-batch", "Stack": "test", "Tier": "large"}


def _cluster(**changes: Any) -> Registrations:
    def build() -> None:
        args: dict[str, Any] = {
            "cluster_name": "llm-batch-test",
            "version": versions.KUBERNETES_VERSION,
            "vpc_id": "vpc-0123",
            "private_subnet_ids": ["subnet-a", "subnet-b"],
            "key_arn": KEY_ARN,
            "partition": "aws",
            **changes,
        }
        EksCluster("eks", EksClusterArgs(**args))

    return register(build)


def test_cluster_endpoint_is_private_and_secrets_encrypted() -> None:
    cluster = one(_cluster(), "eks:index:Cluster")["inputs"]
    assert cluster["endpointPrivateAccess"] is True
    assert cluster["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in cluster
    assert cluster["encryptionConfigKeyArn"] == KEY_ARN
    assert cluster["authenticationMode"] == "API"
    assert cluster["createOidcProvider"] is True
    assert cluster["skipDefaultNodeGroup"] is True
    assert "audit" in cluster["enabledClusterLogTypes"]
    assert cluster["privateSubnetIds"] == ["subnet-a", "subnet-b"]
    assert "publicSubnetIds" not in cluster
    # The vpc-cni addon enforces NetworkPolicy (Ray's head policy, infra/k8s/network_policy.py).
    assert cluster["vpcCniOptions"]["enableNetworkPolicy"] is True


def test_public_cidrs_open_the_endpoint_to_them_only() -> None:
    cluster = one(_cluster(public_access_cidrs=["203.0.113.0/24"]), "eks:index:Cluster")["inputs"]
    assert cluster["endpointPublicAccess"] is True
    assert cluster["publicAccessCidrs"] == ["203.0.113.0/24"]
    assert cluster["endpointPrivateAccess"] is True


def test_submitters_reach_the_api_and_edit_only_the_job_namespace() -> None:
    submitter = f"arn:aws:iam::{CONTEXT.account_id}:role/nightly-submit"
    plan = _cluster(submitter_role_arns=[submitter], job_namespace="llm-batch")
    group = one(plan, "aws:ec2/securityGroup:SecurityGroup", "eks-submitter")
    assert [(rule["fromPort"], rule["toPort"]) for rule in group["inputs"]["egress"]] == [(443, 443)]
    assert "ingress" not in group["inputs"]
    ingress = one(plan, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")["inputs"]
    assert ingress["referencedSecurityGroupId"] == group["id"]
    assert (ingress["fromPort"], ingress["toPort"]) == (443, 443)
    entry = one(plan, "aws:eks/accessEntry:AccessEntry")["inputs"]
    assert entry["principalArn"] == submitter and entry["type"] == "STANDARD"
    association = one(plan, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation")["inputs"]
    assert association["policyArn"].endswith(":cluster-access-policy/AmazonEKSEditPolicy")
    assert association["accessScope"] == {"type": "namespace", "namespaces": ["llm-batch"]}


def test_kubernetes_provider_gets_the_kubeconfig_as_a_secret() -> None:
    provider = one(_cluster(), "pulumi:providers:kubernetes")
    assert provider["inputs"]["kubeconfig"] == "[secret]"


def _node_groups(gpu_instance_type: str | None, *, head_group: bool = True) -> Registrations:
    def build() -> None:
        cluster = EksCluster(
            "eks",
            EksClusterArgs(
                cluster_name="llm-batch-test",
                version=versions.KUBERNETES_VERSION,
                vpc_id="vpc-0123",
                private_subnet_ids=["subnet-a", "subnet-b"],
                key_arn=KEY_ARN,
                partition="aws",
            ),
        )
        NodeGroups(
            "nodes",
            NodeGroupsArgs(
                cluster=cluster.cluster,
                cluster_name="llm-batch-test",
                private_subnet_ids=["subnet-a", "subnet-b"],
                partition="aws",
                head_instance_type="m5.xlarge",
                head_nodes=1,
                volume_gib=200,
                system_instance_type="t3.medium",
                system_volume_gib=20,
                volume_key_arn=KEY_ARN,
                gpu_instance_type=gpu_instance_type,
                gpu_max_nodes=2,
                head_group=head_group,
                tags=TAGS,
            ),
        )

    return register(build)


def test_launch_templates_enforce_imdsv2_encryption_and_tags() -> None:
    templates = of_type(_node_groups("g5.2xlarge"), "aws:ec2/launchTemplate:LaunchTemplate")
    assert sorted(template["name"] for template in templates) == ["nodes-gpu-lt", "nodes-head-lt", "nodes-system-lt"]
    for template in templates:
        inputs = template["inputs"]
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
        (device,) = inputs["blockDeviceMappings"]
        assert device["ebs"]["encrypted"] == "true" and device["ebs"]["volumeType"] == "gp3"
        # The stack key, not AWS's own EBS key (the key policy lets Auto Scaling's service role use it).
        assert device["ebs"]["kmsKeyId"] == KEY_ARN
        assert "keyName" not in inputs and "imageId" not in inputs
        kinds = {spec["resourceType"]: spec["tags"] for spec in inputs["tagSpecifications"]}
        assert kinds["instance"] == kinds["volume"] == TAGS


def test_head_group_is_on_demand_from_zero_and_gpu_group_spot_from_zero() -> None:
    plan = _node_groups("g5.2xlarge")
    templates = {item["name"]: item["id"] for item in of_type(plan, "aws:ec2/launchTemplate:LaunchTemplate")}
    system = one(plan, "eks:index:ManagedNodeGroup", "nodes-system")["inputs"]
    head = one(plan, "eks:index:ManagedNodeGroup", "nodes-head")["inputs"]
    gpu = one(plan, "eks:index:ManagedNodeGroup", "nodes-gpu")["inputs"]
    # One small node all month for CoreDNS and the operators, untainted: what tolerates no pool taint lands here.
    assert system["capacityType"] == "ON_DEMAND" and system["instanceTypes"] == ["t3.medium"]
    assert system["scalingConfig"] == {"minSize": 1, "desiredSize": 1, "maxSize": 2}
    assert system["labels"] == {POOL_LABEL: "system"} and "taints" not in system
    assert system["launchTemplate"]["id"] == templates["nodes-system-lt"]
    # The Ray head's node only while a run needs it: 0 between runs, tainted so only Ray heads keep it up.
    assert head["capacityType"] == "ON_DEMAND" and head["instanceTypes"] == ["m5.xlarge"]
    assert head["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 1}
    assert head["ignoreScalingChanges"] is True
    assert head["labels"] == {POOL_LABEL: "head"}
    assert head["taints"] == [{"key": POOL_LABEL, "value": "head", "effect": "NO_SCHEDULE"}]
    assert head["launchTemplate"]["id"] == templates["nodes-head-lt"]
    assert gpu["capacityType"] == "SPOT" and gpu["instanceTypes"] == ["g5.2xlarge"]
    assert gpu["amiType"] == versions.EKS_GPU_AMI_TYPE
    assert gpu["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 2}
    assert gpu["ignoreScalingChanges"] is True
    assert gpu["taints"] == [{"key": GPU_TAINT_KEY, "value": "true", "effect": "NO_SCHEDULE"}]
    assert gpu["labels"] == {POOL_LABEL: "gpu"}
    assert gpu["launchTemplate"]["id"] == templates["nodes-gpu-lt"]
    assert "diskSize" not in gpu and "remoteAccess" not in gpu


def test_without_a_gpu_group_or_head_group_only_the_system_group_exists() -> None:
    """The large tier: Karpenter makes the GPU and head nodes; the managed groups are the system node's alone."""
    plan = _node_groups(None, head_group=False)
    assert [item["name"] for item in of_type(plan, "eks:index:ManagedNodeGroup")] == ["nodes-system"]
    assert [item["name"] for item in of_type(plan, "aws:ec2/launchTemplate:LaunchTemplate")] == ["nodes-system-lt"]


def _k8s_provider() -> pulumi.ProviderResource:
    import pulumi_kubernetes as k8s

    return k8s.Provider("k8s", kubeconfig="{}")


def _trust(role: dict[str, Any]) -> dict[str, Any]:
    statement: dict[str, Any] = json.loads(role["inputs"]["assumeRolePolicy"])["Statement"][0]
    return statement


def test_job_identity_role_is_assumable_only_by_the_job_service_account() -> None:
    policy_arn = f"arn:aws:iam::{CONTEXT.account_id}:policy/llm-batch-test-job"

    def build() -> None:
        JobIdentity(
            "identity",
            JobIdentityArgs("llm-batch", "llm-batch-job", "llm-batch-worker", policy_arn, OIDC_ARN, OIDC_URL),
            _k8s_provider(),
        )

    plan = register(build)
    role = one(plan, "aws:iam/role:Role", "identity-job-role")
    trust = _trust(role)
    assert trust["Principal"] == {"Federated": OIDC_ARN}
    assert trust["Condition"]["StringEquals"] == {
        f"{OIDC_URL}:sub": "system:serviceaccount:llm-batch:llm-batch-job",
        f"{OIDC_URL}:aud": "sts.amazonaws.com",
    }
    attachments = of_type(plan, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert [attachment["inputs"]["policyArn"] for attachment in attachments] == [policy_arn, policy_arn]
    account = one(plan, "kubernetes:core/v1:ServiceAccount", "identity-service-account")["inputs"]
    assert account["metadata"]["namespace"] == "llm-batch" and account["metadata"]["name"] == "llm-batch-job"
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role["outputs"]["arn"]
    # The GPU workers: their own role, assumable only by their own account, which mounts no API token.
    worker_role = one(plan, "aws:iam/role:Role", "identity-worker-role")
    assert _trust(worker_role)["Condition"]["StringEquals"][f"{OIDC_URL}:sub"] == (
        "system:serviceaccount:llm-batch:llm-batch-worker"
    )
    worker = one(plan, "kubernetes:core/v1:ServiceAccount", "identity-worker-service-account")["inputs"]
    assert worker["metadata"]["name"] == "llm-batch-worker" and worker["automountServiceAccountToken"] is False
    assert worker["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == worker_role["outputs"]["arn"]
    # The nightly cluster's pods admit only each other; its head also the submitter and the operator's namespace,
    # on the job API alone.
    policies = {item["name"]: item["inputs"] for item in of_type(plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy")}
    assert set(policies) == {"identity-ray-cluster-ingress", "identity-ray-head-ingress"}
    assert {policy["metadata"]["namespace"] for policy in policies.values()} == {"llm-batch"}
    ray_pods = {"ray.io/is-ray-node": "yes", "llm-batch.io/ray-cluster": "llm-batch"}
    cluster = policies["identity-ray-cluster-ingress"]["spec"]
    assert cluster["podSelector"] == {"matchLabels": {"llm-batch.io/ray-cluster": "llm-batch"}}
    assert cluster["ingress"] == [{"from": [{"podSelector": {"matchLabels": ray_pods}}]}]
    head = policies["identity-ray-head-ingress"]["spec"]
    assert head["podSelector"] == {"matchLabels": {**ray_pods, "ray.io/node-type": "head"}}
    submitter = {"app.kubernetes.io/component": "ray-job-submitter", "llm-batch.io/ray-cluster": "llm-batch"}
    assert [rule["from"] for rule in head["ingress"]] == [
        [{"podSelector": {"matchLabels": submitter}}],
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}}],
    ]
    assert [rule["ports"] for rule in head["ingress"]] == [[{"protocol": "TCP", "port": 8265}]] * 2
    assert one(plan, "kubernetes:core/v1:Namespace")["inputs"]["metadata"]["name"] == "llm-batch"


def _chart(plan: Registrations, chart: str) -> dict[str, Any]:
    (found,) = [item for item in of_type(plan, "kubernetes:helm.sh/v4:Chart") if chart in item["inputs"]["chart"]]
    return dict(found["inputs"])


def test_operators_are_pinned_charts_on_the_right_nodes() -> None:
    def build() -> None:
        provider = _k8s_provider()
        KubeRayOperator("kuberay", provider)
        NvidiaDevicePlugin("nvidia", provider)

    plan = register(build)
    kuberay = _chart(plan, "kuberay-operator")
    assert kuberay["version"] == versions.HELM_CHARTS["kuberay-operator"][1]
    assert kuberay["repositoryOpts"]["repo"] == versions.HELM_CHARTS["kuberay-operator"][0]
    # On the always-on system node: an operator on a head node would keep it from scaling back to 0.
    assert kuberay["values"]["nodeSelector"] == {POOL_LABEL: "system"}
    assert "tolerations" not in kuberay["values"]
    plugin = _chart(plan, "nvidia-device-plugin")
    assert plugin["version"] == versions.HELM_CHARTS["nvidia-device-plugin"][1]
    terms = plugin["values"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        # Both of the large tier's GPU worker pools: one-GPU (`gpu`) and eight-GPU (`gpu8`) nodes.
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": ["gpu", "gpu8"]}]}
    ]
    assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in plugin["values"]["tolerations"]


def test_cluster_autoscaler_resizes_only_this_clusters_groups() -> None:
    def build() -> None:
        ClusterAutoscaler(
            "ca",
            ClusterAutoscalerArgs("llm-batch-test", CONTEXT, OIDC_ARN, OIDC_URL),
            _k8s_provider(),
        )

    plan = register(build)
    chart = _chart(plan, "cluster-autoscaler")
    assert chart["values"]["autoDiscovery"] == {"clusterName": "llm-batch-test"}
    assert chart["values"]["image"]["tag"] == versions.CLUSTER_AUTOSCALER_IMAGE_TAG
    role = one(plan, "aws:iam/role:Role")
    assert chart["values"]["rbac"]["serviceAccount"]["annotations"] == {
        "eks.amazonaws.com/role-arn": role["outputs"]["arn"]
    }
    assert _trust(role)["Condition"]["StringEquals"][f"{OIDC_URL}:sub"] == (
        "system:serviceaccount:kube-system:cluster-autoscaler"
    )
    policy = json.loads(one(plan, "aws:iam/rolePolicy:RolePolicy")["inputs"]["policy"])
    (resize,) = [s for s in policy["Statement"] if "autoscaling:SetDesiredCapacity" in s["Action"]]
    assert resize["Condition"] == {
        "StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/llm-batch-test": "owned"}
    }


def _karpenter() -> Registrations:
    def build() -> None:
        Karpenter(
            "karpenter",
            KarpenterArgs(
                cluster_name="llm-batch-test",
                context=CONTEXT,
                oidc_provider_arn=OIDC_ARN,
                oidc_provider_url=OIDC_URL,
                cluster_security_group_id="sg-cluster",
                private_subnet_ids=pulumi.Output.from_input(["subnet-a", "subnet-b", "subnet-c"]),
                subnet_count=3,
                ami_alias=versions.EKS_AMI_ALIAS,
                volume_gib=200,
                volume_key_arn=KEY_ARN,
                node_pool=NodePoolArgs(),
                head_instance_type="m5.xlarge",
                head_nodes=1,
                tag_existing_subnets=True,
                tags=TAGS,
            ),
            _k8s_provider(),
        )

    return register(build)


@pytest.fixture(scope="module")
def karpenter_plan() -> Registrations:
    return _karpenter()


def test_interruption_queue_is_encrypted_tls_only_and_fed_by_four_rules(
    karpenter_plan: Registrations,
) -> None:
    queue = one(karpenter_plan, "aws:sqs/queue:Queue")
    assert queue["inputs"]["sqsManagedSseEnabled"] is True
    policy = json.loads(one(karpenter_plan, "aws:sqs/queuePolicy:QueuePolicy")["inputs"]["policy"])
    (deny,) = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and deny["Principal"] == "*"
    rules = {
        item["name"]: json.loads(item["inputs"]["eventPattern"])
        for item in of_type(karpenter_plan, "aws:cloudwatch/eventRule:EventRule")
    }
    assert sorted(rules) == sorted(f"karpenter-{event}" for event in INTERRUPTION_EVENTS)
    detail_types = {pattern["detail-type"][0] for pattern in rules.values()}
    assert detail_types == {
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "AWS Health Event",
    }
    targets = of_type(karpenter_plan, "aws:cloudwatch/eventTarget:EventTarget")
    assert len(targets) == 4 and {target["inputs"]["arn"] for target in targets} == {queue["outputs"]["arn"]}
    chart = _chart(karpenter_plan, "karpenter")
    assert chart["values"]["settings"] == {
        "clusterName": "llm-batch-test",
        "interruptionQueue": queue["outputs"]["name"],
    }
    assert chart["chart"] == versions.HELM_CHARTS["karpenter"][0]
    assert chart["version"] == versions.HELM_CHARTS["karpenter"][1]


def test_karpenter_nodes_have_their_own_role_and_access_entry(karpenter_plan: Registrations) -> None:
    node_role = one(karpenter_plan, "aws:iam/role:Role", "karpenter-node-role")
    assert node_role["inputs"]["name"] == "llm-batch-test-karpenter-node"
    entry = one(karpenter_plan, "aws:eks/accessEntry:AccessEntry")["inputs"]
    assert entry == {
        "clusterName": "llm-batch-test",
        "principalArn": node_role["outputs"]["arn"],
        "type": "EC2_LINUX",
    }
    controller = json.loads(one(karpenter_plan, "aws:iam/rolePolicy:RolePolicy")["inputs"]["policy"])
    statements = {statement["Sid"]: statement for statement in controller["Statement"]}
    assert statements["PassNodeRole"]["Resource"] == node_role["outputs"]["arn"]
    assert statements["InterruptionQueue"]["Resource"] == one(karpenter_plan, "aws:sqs/queue:Queue")["outputs"]["arn"]
    for sid in ("CreateOwnResources", "DeleteOwnResources", "TagOnCreate", "LaunchFromOwnTemplates"):
        assert "Condition" in statements[sid], f"{sid} must be scoped to this cluster's tags"
    assert "llm-batch-test" in json.dumps(statements["DeleteOwnResources"]["Condition"])
    # The nodes' volumes are on the stack key: Karpenter may use it and grant it to EBS, only through EC2.
    use, grant = statements["NodeVolumesUseStackKey"], statements["NodeVolumesGrantToEbs"]
    assert use["Resource"] == grant["Resource"] == KEY_ARN
    assert grant["Action"] == "kms:CreateGrant"
    assert grant["Condition"]["Bool"] == {"kms:GrantIsForAWSResource": True}
    assert use["Condition"] == {"StringEquals": {"kms:ViaService": ["ec2.us-east-1.amazonaws.com"]}}
    assert grant["Condition"]["StringEquals"] == use["Condition"]["StringEquals"]


def test_discovery_tags_mark_every_private_subnet_and_the_cluster_group(
    karpenter_plan: Registrations,
) -> None:
    tags = of_type(karpenter_plan, "aws:ec2/tag:Tag")
    assert {(tag["inputs"]["resourceId"], tag["inputs"]["key"], tag["inputs"]["value"]) for tag in tags} == {
        (resource, DISCOVERY_TAG, "llm-batch-test") for resource in ("subnet-a", "subnet-b", "subnet-c", "sg-cluster")
    }


def test_node_class_and_pool_in_the_plan_match_the_crds(karpenter_plan: Registrations, crds_dir: Path) -> None:
    node_class = one(karpenter_plan, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")["inputs"]
    node_pool = one(karpenter_plan, "kubernetes:karpenter.sh/v1:NodePool", "karpenter-nodepool-gpu-spot")["inputs"]
    head_pool = one(karpenter_plan, "kubernetes:karpenter.sh/v1:NodePool", "karpenter-nodepool-head")["inputs"]
    assert_valid(node_class, crds_dir)
    assert_valid(node_pool, crds_dir)
    assert_valid(head_pool, crds_dir)
    # The head pool: no node until a Ray head is Pending (a NodePool has no minimum), on-demand only, tainted so
    # only Ray heads land there, removed a minute after it is empty, at most one m5.xlarge.
    template = head_pool["spec"]["template"]
    assert template["metadata"]["labels"] == {POOL_LABEL: "head"}
    assert template["spec"]["taints"] == [{"key": POOL_LABEL, "value": "head", "effect": "NoSchedule"}]
    requirements = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["on-demand"]
    assert requirements["node.kubernetes.io/instance-type"] == ["m5.xlarge"]
    assert head_pool["spec"]["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "60s"}
    assert head_pool["spec"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert template["spec"]["nodeClassRef"]["name"] == node_class["metadata"]["name"]
    # Karpenter's controller runs on the always-on system node, never on a node it may remove.
    controller = next(
        item for item in of_type(karpenter_plan, "kubernetes:helm.sh/v4:Chart") if "karpenter" in item["name"]
    )
    assert controller["inputs"]["values"]["nodeSelector"] == {POOL_LABEL: "system"}
    assert node_class["spec"]["role"] == "llm-batch-test-karpenter-node"
    assert node_class["spec"]["amiSelectorTerms"] == [{"alias": versions.EKS_AMI_ALIAS}]
    assert node_class["spec"]["tags"] == TAGS
    assert [device["ebs"]["kmsKeyID"] for device in node_class["spec"]["blockDeviceMappings"]] == [KEY_ARN]
    assert node_pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == node_class["metadata"]["name"]


def test_the_gpu_nodes_put_kubelet_storage_on_their_instance_store() -> None:
    """Only the GPU group's template carries a nodeadm NodeConfig, and it stripes the instance store (RAID0) as
    the kubelet's storage: the pods' `models` emptyDir then sits on local NVMe (docs/model-and-nodes.md)."""
    import base64

    import yaml

    templates = {
        t["name"]: t["inputs"] for t in of_type(_node_groups("g5.2xlarge"), "aws:ec2/launchTemplate:LaunchTemplate")
    }
    assert "userData" not in templates["nodes-system-lt"] and "userData" not in templates["nodes-head-lt"]
    mime = base64.b64decode(templates["nodes-gpu-lt"]["userData"]).decode()
    part = mime.split("Content-Type: application/node.eks.aws", 1)[1].split("--LLMBATCH--", 1)[0]
    node_config = yaml.safe_load(part)
    assert node_config["kind"] == "NodeConfig" and node_config["apiVersion"] == "node.eks.aws/v1alpha1"
    assert node_config["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"
