"""Managed node groups of the EKS tiers, built from launch templates this program declares.

The launch templates are plain `aws.ec2.LaunchTemplate` resources (not hidden inside pulumi-eks), so the
plan's checks see IMDSv2, the encrypted volumes and the instance tags. System group: one small on-demand node
all month for CoreDNS and the operators (infra/k8s/head_group.py). Head group (medium): on-demand, tainted for
the Ray heads, 0 nodes until the cluster autoscaler grows it for a run's Pending head and back to 0 after (the
large tier's head nodes come from Karpenter's head NodePool instead). GPU group (medium): Spot, tainted for GPU
pods, scaled from 0 the same way.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra import versions
from infra.components.iam import service_trust
from infra.k8s.common import GPU_POOL, GPU_TAINT_KEY, GPU_TAINT_VALUE, HEAD_POOL, POOL_LABEL, SYSTEM_POOL
from infra.k8s.head_group import SYSTEM_NODES

# AWS-managed policies every EKS node needs (join the cluster, pull images, run the VPC CNI).
NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonEKS_CNI_Policy",
)


@dataclass(frozen=True)
class NodeGroupsArgs:
    cluster: eks.Cluster
    cluster_name: str
    private_subnet_ids: pulumi.Input[Sequence[str]]
    partition: str
    head_instance_type: str
    head_nodes: int
    volume_gib: int
    system_instance_type: str
    system_volume_gib: int
    # The stack key: the key policy lets EC2 Auto Scaling's service-linked role use it (infra/components/kms.py).
    volume_key_arn: pulumi.Input[str]
    # None: no managed GPU group (Karpenter makes GPU nodes instead).
    gpu_instance_type: str | None
    gpu_max_nodes: int
    # False: Karpenter's head NodePool makes the head nodes (large tier), no managed head group.
    head_group: bool = True
    tags: dict[str, str] = field(default_factory=dict)
    # The control plane's version: set on each group, so an `up` that raises the cluster's version then rolls
    # the groups' nodes to it (the groups wait for the cluster); unset, a group would stay on its first version.
    kubernetes_version: str | None = None


def node_role(name: str, partition: str, parent: pulumi.Resource, role_name: str | None = None) -> aws.iam.Role:
    """An EC2 role with the three node policies (managed groups' nodes and Karpenter's alike)."""
    role = aws.iam.Role(
        f"{name}-role",
        name=role_name,
        assume_role_policy=service_trust("ec2.amazonaws.com"),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    for policy in NODE_POLICIES:
        aws.iam.RolePolicyAttachment(
            f"{name}-{policy}",
            role=role.name,
            policy_arn=f"arn:{partition}:iam::aws:policy/{policy}",
            opts=pulumi.ResourceOptions(parent=parent),
        )
    return role


# nodeadm's NodeConfig (AL2023 EKS AMIs), which EKS merges with its own for a managed node group on its AMI:
# the instance-store NVMe disks striped as RAID0 and used as the kubelet's and containerd's storage, so the GPU
# pods' `models` emptyDir (weights, compile caches) is on local NVMe, not the gp3 root volume's 125 MiB/s. The
# same as Karpenter's `instanceStorePolicy: RAID0` on the large tier (docs/model-and-nodes.md).
LOCAL_STORAGE_USER_DATA = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="LLMBATCH"

--LLMBATCH
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0

--LLMBATCH--
"""


def launch_template(
    name: str,
    volume_gib: int,
    tags: dict[str, str],
    parent: pulumi.Resource,
    *,
    key_arn: pulumi.Input[str],
    local_storage: bool = False,
) -> aws.ec2.LaunchTemplate:
    """IMDSv2 only (hop limit 1: pods get credentials through IRSA, never the node's), gp3 root encrypted with
    the stack key, no SSH key, cost tags on the instances and volumes (default tags do not reach what an ASG
    launches). `local_storage`: the node's instance store as its ephemeral storage (LOCAL_STORAGE_USER_DATA)."""
    user_data = base64.b64encode(LOCAL_STORAGE_USER_DATA.encode()).decode() if local_storage else None
    return aws.ec2.LaunchTemplate(
        f"{name}-lt",
        description=f"{name}: EKS managed node group",
        update_default_version=True,
        user_data=user_data,
        metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
            http_endpoint="enabled",
            http_tokens="required",
            http_put_response_hop_limit=1,
            instance_metadata_tags="disabled",
        ),
        block_device_mappings=[
            aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda",
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=volume_gib,
                    volume_type="gp3",
                    encrypted="true",
                    kms_key_id=key_arn,
                    delete_on_termination="true",
                ),
            )
        ],
        tag_specifications=[
            aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
            for kind in ("instance", "volume", "network-interface")
        ],
        opts=pulumi.ResourceOptions(parent=parent),
    )


def coredns_addon(name: str, cluster_name: str, system: pulumi.Resource, parent: pulumi.Resource) -> aws.eks.Addon:
    """CoreDNS as the EKS add-on, pinned to the system node (its configuration schema takes `nodeSelector`).

    pulumi-eks creates the add-on only with its default node group or Fargate (pulumi/pulumi-eks#1371), and this
    cluster has neither, so EKS's self-managed CoreDNS would otherwise run wherever no taint keeps it off. Pinned,
    it never lands on a head node (which it would keep from scaling to 0). OVERWRITE adopts the self-managed
    Deployment EKS created with the cluster; the add-on waits for the system node, where its pods run.
    """
    return aws.eks.Addon(
        f"{name}-coredns",
        cluster_name=cluster_name,
        addon_name="coredns",
        configuration_values=json.dumps({"nodeSelector": {POOL_LABEL: SYSTEM_POOL}}),
        resolve_conflicts_on_create="OVERWRITE",
        resolve_conflicts_on_update="OVERWRITE",
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[system]),
    )


class NodeGroups(pulumi.ComponentResource):
    """The node role, the head group and (medium) the Spot GPU group."""

    node_role: aws.iam.Role
    gpu_group_name: str | None

    def __init__(self, name: str, args: NodeGroupsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:node_groups:NodeGroups", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.node_role = node_role(f"{name}-node", args.partition, self)

        system_lt = launch_template(
            f"{name}-system", args.system_volume_gib, args.tags, self, key_arn=args.volume_key_arn
        )
        system = eks.ManagedNodeGroup(
            f"{name}-system",
            cluster=args.cluster,
            node_group_name=f"{args.cluster_name}-system",
            node_role=self.node_role,
            subnet_ids=args.private_subnet_ids,
            ami_type=versions.EKS_HEAD_AMI_TYPE,
            version=args.kubernetes_version,
            capacity_type="ON_DEMAND",
            instance_types=[args.system_instance_type],
            # One node all month; the second place is for a rolling update's replacement.
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=SYSTEM_NODES, desired_size=SYSTEM_NODES, max_size=SYSTEM_NODES + 1
            ),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=system_lt.id, version=system_lt.latest_version.apply(str)
            ),
            labels={POOL_LABEL: SYSTEM_POOL},
            tags=args.tags,
            opts=child,
        )

        coredns_addon(name, args.cluster_name, system, self)

        if args.head_group:
            head_lt = launch_template(f"{name}-head", args.volume_gib, args.tags, self, key_arn=args.volume_key_arn)
            eks.ManagedNodeGroup(
                f"{name}-head",
                cluster=args.cluster,
                node_group_name=f"{args.cluster_name}-head",
                node_role=self.node_role,
                subnet_ids=args.private_subnet_ids,
                ami_type=versions.EKS_HEAD_AMI_TYPE,
                version=args.kubernetes_version,
                capacity_type="ON_DEMAND",
                instance_types=[args.head_instance_type],
                # 0 between runs: the cluster autoscaler grows it for a Pending Ray head, shrinks it after.
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(min_size=0, desired_size=0, max_size=args.head_nodes),
                ignore_scaling_changes=True,
                launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                    id=head_lt.id, version=head_lt.latest_version.apply(str)
                ),
                labels={POOL_LABEL: HEAD_POOL},
                taints=[aws.eks.NodeGroupTaintArgs(key=POOL_LABEL, value=HEAD_POOL, effect="NO_SCHEDULE")],
                tags=args.tags,
                opts=child,
            )

        self.gpu_group_name = None
        if args.gpu_instance_type is not None:
            gpu_lt = launch_template(
                f"{name}-gpu", args.volume_gib, args.tags, self, key_arn=args.volume_key_arn, local_storage=True
            )
            self.gpu_group_name = f"{args.cluster_name}-gpu"
            eks.ManagedNodeGroup(
                f"{name}-gpu",
                cluster=args.cluster,
                node_group_name=self.gpu_group_name,
                node_role=self.node_role,
                subnet_ids=args.private_subnet_ids,
                ami_type=versions.EKS_GPU_AMI_TYPE,
                version=args.kubernetes_version,
                capacity_type="SPOT",
                instance_types=[args.gpu_instance_type],
                # 0 when no job runs; the cluster autoscaler sets the size for a run, so Pulumi leaves it be.
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                    min_size=0, desired_size=0, max_size=args.gpu_max_nodes
                ),
                ignore_scaling_changes=True,
                launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                    id=gpu_lt.id, version=gpu_lt.latest_version.apply(str)
                ),
                labels={POOL_LABEL: GPU_POOL},
                taints=[aws.eks.NodeGroupTaintArgs(key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect="NO_SCHEDULE")],
                tags=args.tags,
                opts=child,
            )
        self.register_outputs({"node_role_arn": self.node_role.arn})
