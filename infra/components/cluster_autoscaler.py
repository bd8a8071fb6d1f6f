"""The cluster autoscaler (medium tier): grows the Spot GPU group from 0 when Ray workers are Pending, and
shrinks it back to 0 minutes after the run's cluster is gone.

It finds the group by the tags EKS puts on managed node groups' Auto Scaling groups, and reads the group's
labels and taints from EKS, so it can scale up from zero nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi

from infra import versions
from infra.aws_context import AwsContext
from infra.components import irsa
from infra.components.helm import pinned_chart
from infra.k8s.common import POOL_LABEL, SYSTEM_POOL
from infra.k8s.head_group import CLUSTER_AUTOSCALER

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"


@dataclass(frozen=True)
class ClusterAutoscalerArgs:
    cluster_name: str
    context: AwsContext
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    scale_down_after: str = "5m"
    # The control plane's version: the autoscaler's image is the one of the same minor.
    kubernetes_version: str = versions.KUBERNETES_VERSION


def autoscaler_policy(cluster_name: str, context: AwsContext) -> dict[str, Any]:
    """Change sizes only of this cluster's groups (by the ownership tag EKS sets); read the rest."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ResizeOwnGroups",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                ],
                "Resource": context.arn("autoscaling", "autoScalingGroup:*:autoScalingGroupName/*"),
                "Condition": {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}},
            },
            {
                "Sid": "Discover",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "autoscaling:DescribeTags",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                "Resource": "*",
            },
            {
                "Sid": "ReadOwnNodeGroups",
                "Effect": "Allow",
                "Action": "eks:DescribeNodegroup",
                "Resource": context.arn("eks", f"nodegroup/{cluster_name}/*/*"),
            },
        ],
    }


class ClusterAutoscaler(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        args: ClusterAutoscalerArgs,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmbatch:cluster_autoscaler:ClusterAutoscaler", name, None, opts)
        role = irsa.service_account_role(
            name,
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            policy=json.dumps(autoscaler_policy(args.cluster_name, args.context)),
            parent=self,
        )
        pinned_chart(
            f"{name}-chart",
            "cluster-autoscaler",
            NAMESPACE,
            {
                "cloudProvider": "aws",
                "awsRegion": args.context.region,
                "autoDiscovery": {"clusterName": args.cluster_name},
                "image": {"tag": versions.CLUSTER_AUTOSCALER_IMAGE_TAGS[args.kubernetes_version]},
                "rbac": {
                    "serviceAccount": {
                        "name": SERVICE_ACCOUNT,
                        "annotations": {"eks.amazonaws.com/role-arn": role.arn},
                    }
                },
                "extraArgs": {
                    # GPU nodes cost most idle: remove them soon after the run's pods are gone.
                    "scale-down-unneeded-time": args.scale_down_after,
                    "scale-down-delay-after-add": args.scale_down_after,
                    "expander": "least-waste",
                    "balance-similar-node-groups": "true",
                },
                "nodeSelector": {POOL_LABEL: SYSTEM_POOL},
                "resources": {
                    "requests": CLUSTER_AUTOSCALER.as_dict(),
                    "limits": {"cpu": "500m", "memory": CLUSTER_AUTOSCALER.memory},
                },
            },
            pulumi.ResourceOptions(parent=self, provider=provider),
        )
        self.register_outputs({"role_arn": role.arn})
