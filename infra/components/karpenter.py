"""Karpenter (large tier): launches Spot GPU nodes for Pending Ray workers and removes them when idle.

Here: the controller's IAM role (IRSA, scoped to this cluster's tags), the nodes' role and its EKS access
entry, the interruption queue (SSE, TLS only) fed by EventBridge with Spot interruption warnings, rebalance
recommendations, instance state changes and AWS Health events, discovery tags on the private subnets and the
cluster security group, the pinned Helm release, and the EC2NodeClass and NodePool (`infra.k8s.karpenter`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.aws_context import AwsContext
from infra.components import irsa
from infra.components.helm import namespace, pinned_chart
from infra.components.iam import deny_insecure_transport, via_services
from infra.components.node_groups import node_role
from infra.k8s.common import POOL_LABEL, SYSTEM_POOL, Manifest
from infra.k8s.head_group import KARPENTER_CONTROLLER
from infra.k8s.karpenter import (
    DISCOVERY_TAG,
    NodeClassArgs,
    NodePoolArgs,
    render_head_node_pool,
    render_node_class,
    render_node_pools,
)

NAMESPACE = "karpenter"
SERVICE_ACCOUNT = "karpenter"

# What Karpenter handles from the queue: each lets it drain a node before EC2 takes it away.
INTERRUPTION_EVENTS: dict[str, dict[str, Any]] = {
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "instance-state-change": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
    },
    "scheduled-change": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
}


@dataclass(frozen=True)
class KarpenterArgs:
    cluster_name: str
    context: AwsContext
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    cluster_security_group_id: pulumi.Input[str]
    private_subnet_ids: pulumi.Output[list[str]]
    # How many private subnets there are, from config: resources are never created inside an apply.
    subnet_count: int
    ami_alias: str
    volume_gib: int
    # The stack key, for the nodes' root volumes (the EC2NodeClass's kmsKeyID).
    volume_key_arn: pulumi.Input[str]
    node_pool: NodePoolArgs
    # The Ray head's on-demand nodes: Karpenter's head NodePool, from 0 between runs.
    head_instance_type: str
    head_nodes: int
    # True for an existing VPC's subnets, which this program does not own: an `ec2.Tag` adds the discovery tag.
    # False when the program creates them: the tag is in the Subnet's own tags (`Network.private_subnet_tags`),
    # since an `ec2.Tag` on a subnet whose tags the Subnet resource owns is removed by the next `up`.
    tag_existing_subnets: bool
    tags: dict[str, str] = field(default_factory=dict)
    # More GPU pools from the same node class: the large tier's eight-GPU workers (`eks.eight_gpu`).
    other_gpu_pools: tuple[NodePoolArgs, ...] = ()


def queue_policy(queue_arn: str, account_id: str) -> dict[str, Any]:
    """EventBridge (and SQS itself) may send, for this account's rules only (no other account's rule can
    target the queue: the confused-deputy guard AWS documents for EventBridge targets); nobody may use the
    queue without TLS."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "EventBridgeSends",
                "Effect": "Allow",
                "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
            },
            deny_insecure_transport("sqs:*", queue_arn),
        ],
    }


def volume_key_statements(key_arn: str) -> list[dict[str, Any]]:
    """What the role that calls RunInstances/CreateFleet needs to launch with volumes on a customer key.

    EC2 creates the volumes with the caller's permissions on the key (Amazon EBS User Guide, "Permissions
    for IAM users" under EBS encryption): the data-key calls and a grant that lets EBS use the key for the
    volume's life, the grant only ever for an AWS resource. Both only through EC2 (kms:ViaService), so the
    controller's credentials alone cannot decrypt anything with the key. The key policy lets IAM policies of
    the account grant this (its administration statement covers kms:CreateGrant).
    """
    through_ec2 = via_services(key_arn, "ec2")
    return [
        {
            "Sid": "NodeVolumesUseStackKey",
            "Effect": "Allow",
            "Action": [
                "kms:Decrypt",
                "kms:DescribeKey",
                "kms:GenerateDataKeyWithoutPlaintext",
                "kms:ReEncryptFrom",
                "kms:ReEncryptTo",
            ],
            "Resource": key_arn,
            "Condition": through_ec2,
        },
        {
            "Sid": "NodeVolumesGrantToEbs",
            "Effect": "Allow",
            "Action": "kms:CreateGrant",
            "Resource": key_arn,
            "Condition": {**through_ec2, "Bool": {"kms:GrantIsForAWSResource": True}},
        },
    ]


def controller_policy(
    cluster_name: str, context: AwsContext, node_role_arn: str, queue_arn: str, volume_key_arn: str
) -> dict[str, Any]:
    """Karpenter's controller policy, after its reference CloudFormation: writes only on resources tagged as
    this cluster's, reads where AWS offers no resource scoping; plus the stack key for the nodes' volumes."""
    region = context.region
    owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    request_owned = {
        f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
        "aws:RequestTag/eks:eks-cluster-name": cluster_name,
    }
    has_pool = {"aws:RequestTag/karpenter.sh/nodepool": "*"}
    created = [
        context.arn("ec2", kind)
        for kind in (
            "fleet/*",
            "instance/*",
            "volume/*",
            "network-interface/*",
            "launch-template/*",
            "spot-instances-request/*",
        )
    ]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "LaunchFromSharedResources",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": [
                    f"arn:{context.partition}:ec2:{region}::image/*",
                    f"arn:{context.partition}:ec2:{region}::snapshot/*",
                    context.arn("ec2", "security-group/*"),
                    context.arn("ec2", "subnet/*"),
                    context.arn("ec2", "capacity-reservation/*"),
                ],
            },
            {
                "Sid": "LaunchFromOwnTemplates",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": context.arn("ec2", "launch-template/*"),
                "Condition": {
                    "StringEquals": owned,
                    "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                },
            },
            {
                "Sid": "CreateOwnResources",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                "Resource": created,
                "Condition": {"StringEquals": request_owned, "StringLike": has_pool},
            },
            {
                "Sid": "TagOnCreate",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": created,
                "Condition": {
                    "StringEquals": {
                        **request_owned,
                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                    },
                    "StringLike": has_pool,
                },
            },
            {
                "Sid": "TagOwnInstances",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": context.arn("ec2", "instance/*"),
                "Condition": {
                    "StringEquals": owned,
                    "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                    "ForAllValues:StringEquals": {
                        "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                    },
                },
            },
            {
                "Sid": "DeleteOwnResources",
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                "Resource": [context.arn("ec2", "instance/*"), context.arn("ec2", "launch-template/*")],
                "Condition": {
                    "StringEquals": owned,
                    "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                },
            },
            {
                "Sid": "RegionalReads",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeCapacityReservations",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    # Karpenter's instance health checks (upstream grants it since v1.12): without it the controller
                    # logs "permission is not allowed" and turns them off, so a GPU node failing its EC2 status
                    # checks is never replaced and can hang a night until the RayJob's deadline.
                    "ec2:DescribeInstanceStatus",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribePlacementGroups",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                ],
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
            },
            {
                "Sid": "AmiParameters",
                "Effect": "Allow",
                "Action": "ssm:GetParameter",
                "Resource": f"arn:{context.partition}:ssm:{region}::parameter/aws/service/*",
            },
            {"Sid": "Prices", "Effect": "Allow", "Action": "pricing:GetProducts", "Resource": "*"},
            {
                "Sid": "InterruptionQueue",
                "Effect": "Allow",
                "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                "Resource": queue_arn,
            },
            {
                "Sid": "PassNodeRole",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_role_arn,
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            },
            {
                "Sid": "OwnInstanceProfiles",
                "Effect": "Allow",
                "Action": [
                    "iam:CreateInstanceProfile",
                    "iam:TagInstanceProfile",
                    "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile",
                ],
                "Resource": context.arn("iam", "instance-profile/*", region=False),
                "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}},
            },
            {
                "Sid": "CreateOwnInstanceProfiles",
                "Effect": "Allow",
                "Action": ["iam:CreateInstanceProfile", "iam:TagInstanceProfile"],
                "Resource": context.arn("iam", "instance-profile/*", region=False),
                "Condition": {
                    "StringEquals": {
                        f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
                        "aws:RequestTag/topology.kubernetes.io/region": region,
                    }
                },
            },
            {
                "Sid": "ReadInstanceProfiles",
                "Effect": "Allow",
                "Action": "iam:GetInstanceProfile",
                "Resource": context.arn("iam", "instance-profile/*", region=False),
            },
            {
                # IAM authorises List* calls on "*" only: scoped to instance-profile/*, the call is denied and
                # Karpenter's garbage collection of old instance profiles fails (Karpenter's reference policy:
                # AllowUnscopedInstanceProfileListAction).
                "Sid": "ListInstanceProfiles",
                "Effect": "Allow",
                "Action": "iam:ListInstanceProfiles",
                "Resource": "*",
            },
            {
                "Sid": "FindApiServer",
                "Effect": "Allow",
                "Action": "eks:DescribeCluster",
                "Resource": context.arn("eks", f"cluster/{cluster_name}"),
            },
            *volume_key_statements(volume_key_arn),
        ],
    }


def _item(index: int) -> Callable[[list[str]], str]:
    return lambda items: items[index]


def node_manifests(args: KarpenterArgs, node_role_name: str, volume_key_arn: str | None) -> list[Manifest]:
    """The EC2NodeClass, the GPU NodePools (each Spot pool and its on-demand fallback) and the head NodePool
    this component applies (also what the CRD tests validate)."""
    node_class = render_node_class(
        NodeClassArgs(
            name=args.node_pool.node_class,
            cluster_name=args.cluster_name,
            node_role=node_role_name,
            ami_alias=args.ami_alias,
            volume_size_gib=args.volume_gib,
            volume_kms_key_id=volume_key_arn,
            tags=args.tags,
        )
    )
    head_pool = render_head_node_pool(args.head_instance_type, args.head_nodes, args.node_pool.node_class)
    gpu_pools = [pool for args_pool in (args.node_pool, *args.other_gpu_pools) for pool in render_node_pools(args_pool)]
    return [node_class, *gpu_pools, head_pool]


class Karpenter(pulumi.ComponentResource):
    """Outputs: the interruption queue's name and the node role's ARN."""

    queue_name: str
    node_role_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: KarpenterArgs,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmbatch:karpenter:Karpenter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster = args.cluster_name

        # A fixed name: the EC2NodeClass names the role, and the controller may pass only this one.
        node_role_name = f"{cluster}-karpenter-node"
        nodes = node_role(f"{name}-node", args.context.partition, self, role_name=node_role_name)
        aws.eks.AccessEntry(
            f"{name}-node-access", cluster_name=cluster, principal_arn=nodes.arn, type="EC2_LINUX", opts=child
        )

        # Karpenter's convention: the queue is named after the cluster. SSE with SQS-owned keys: EventBridge
        # needs no grant on the stack's key to deliver, and the messages hold only instance ids.
        self.queue_name = cluster
        queue = aws.sqs.Queue(
            f"{name}-interruptions",
            name=cluster,
            message_retention_seconds=300,
            sqs_managed_sse_enabled=True,
            opts=child,
        )
        aws.sqs.QueuePolicy(
            f"{name}-interruptions-policy",
            queue_url=queue.url,
            policy=queue.arn.apply(lambda arn: json.dumps(queue_policy(arn, args.context.account_id))),
            opts=child,
        )
        for event, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{event}",
                description=f"{cluster}: {pattern['detail-type'][0]} -> Karpenter",
                event_pattern=json.dumps(pattern),
                opts=child,
            )
            aws.cloudwatch.EventTarget(
                f"{name}-{event}-target", rule=rule.name, arn=queue.arn, target_id="karpenter", opts=child
            )

        # Where Karpenter may put nodes: the private subnets and the cluster security group, found by tag. The
        # security group is EKS's own (pulumi-eks reports it; no resource here owns its tags).
        for index in range(args.subnet_count if args.tag_existing_subnets else 0):
            aws.ec2.Tag(
                f"{name}-subnet-{index}-discovery",
                resource_id=args.private_subnet_ids.apply(_item(index)),
                key=DISCOVERY_TAG,
                value=cluster,
                opts=child,
            )
        aws.ec2.Tag(
            f"{name}-sg-discovery",
            resource_id=args.cluster_security_group_id,
            key=DISCOVERY_TAG,
            value=cluster,
            opts=child,
        )

        policy = pulumi.Output.all(nodes.arn, queue.arn, args.volume_key_arn).apply(
            lambda arns: json.dumps(controller_policy(cluster, args.context, arns[0], arns[1], arns[2]))
        )
        controller = irsa.service_account_role(
            f"{name}-controller",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            policy=policy,
            parent=self,
        )
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider)
        ns = namespace(f"{name}-namespace", NAMESPACE, k8s_opts)
        chart = pinned_chart(
            f"{name}-chart",
            "karpenter",
            NAMESPACE,
            {
                "settings": {"clusterName": cluster, "interruptionQueue": queue.name},
                "serviceAccount": {
                    "name": SERVICE_ACCOUNT,
                    "annotations": {"eks.amazonaws.com/role-arn": controller.arn},
                },
                # One replica on the one always-on system node: a restart delays new nodes by seconds, and a
                # second replica would need a second always-on node.
                "replicas": 1,
                "nodeSelector": {POOL_LABEL: SYSTEM_POOL},
                "controller": {
                    "resources": {
                        "requests": KARPENTER_CONTROLLER.as_dict(),
                        "limits": {"cpu": "1", "memory": KARPENTER_CONTROLLER.memory},
                    }
                },
            },
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[ns]),
        )

        # Rendered once without the key (names and metadata are known now), and the node class's spec again
        # with the key's ARN once it is known.
        node_class, *pools = node_manifests(args, node_role_name, None)
        node_class_spec = pulumi.Output.from_input(args.volume_key_arn).apply(
            lambda key_arn: node_manifests(args, node_role_name, key_arn)[0]["spec"]
        )
        after_chart = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[chart])
        manifests = ((node_class, node_class_spec), *((pool, pool["spec"]) for pool in pools))
        for manifest, spec in manifests:
            k8s.apiextensions.CustomResource(
                f"{name}-{manifest['kind'].lower()}-{manifest['metadata']['name']}",
                api_version=manifest["apiVersion"],
                kind=manifest["kind"],
                metadata=manifest["metadata"],
                spec=spec,
                opts=after_chart,
            )
        self.node_role_arn = nodes.arn
        self.register_outputs({"queue_name": self.queue_name, "node_role_arn": self.node_role_arn})
