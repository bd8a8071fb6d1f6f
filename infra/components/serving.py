"""The online endpoint on the EKS tiers (`serve.enabled`): the RayService, its own GPU nodes, its NetworkPolicy.

The starvation rule: the endpoint's GPU workers run only on nodes of their own pool (`llm-batch.io/pool: serve`),
the nightly job's only on the `gpu` pool, each pool with its own ceiling. On the medium tier the endpoint's pool
is a managed node group of its own (the cluster autoscaler grows it from 0); on the large tier a Karpenter
NodePool of its own, whose limits cover `serve.max_replicas` workers and nothing more. Neither workload can hold
a node, or use up a node ceiling, the other needs; docs/serve.md says what that means when both want GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from infra import versions
from infra.components.kuberay import OPERATOR_NAMESPACE
from infra.components.network_policies import declare_network_policies
from infra.components.node_groups import launch_template
from infra.k8s.common import GPU_TAINT_KEY, GPU_TAINT_VALUE, POOL_LABEL, Manifest
from infra.k8s.instance_types import shape_of
from infra.k8s.karpenter import NodePoolArgs, render_node_pool
from infra.k8s.network_policy import CLUSTER_LABEL, ray_cluster_ingress, ray_head_ingress, serve_ingress
from infra.k8s.rayjob import RAY_API_VERSION
from infra.k8s.rayservice import SERVE_POOL

SERVE_NODE_POOL = "gpu-serve"


@dataclass(frozen=True)
class ServingArgs:
    cluster: eks.Cluster
    cluster_name: str
    namespace: str
    rayservice: pulumi.Output[Manifest]
    pod_labels: dict[str, str]
    vpc_cidr: pulumi.Input[str]
    instance_type: str
    capacity_type: str  # "on-demand" or "spot"
    # The most worker pods at once (infra.eks_serve.serve_worker_ceiling): the pool's node ceiling.
    max_workers: int
    gpus_per_worker: int
    # Medium: a managed node group of the endpoint's own, built with this role and subnets.
    node_role: aws.iam.Role | None
    private_subnet_ids: pulumi.Input[Sequence[str]]
    volume_gib: int
    # The stack key the endpoint's node volumes are encrypted with (the volume-keys rule).
    volume_key_arn: pulumi.Input[str]
    # Large: a Karpenter NodePool of its own, on the stack's EC2NodeClass; None on the medium tier.
    node_class: str | None
    # What the custom resources wait for: the KubeRay chart (the RayService CRD), the job namespace, Karpenter.
    depends_on: Sequence[pulumi.Resource] = ()
    tags: dict[str, str] = field(default_factory=dict)
    # The control plane's version, so the endpoint's managed group moves with it (as NodeGroups' do).
    kubernetes_version: str | None = None


def serve_node_pool(args: ServingArgs) -> Manifest:
    """The large tier's NodePool for the endpoint: its own label, limits for `max_workers` nodes and no more."""
    shape = shape_of(args.instance_type)
    per_node = max(1, shape.gpus // args.gpus_per_worker)
    nodes = math.ceil(args.max_workers / per_node)
    if args.node_class is None:
        raise ValueError("the endpoint's NodePool needs the stack's EC2NodeClass (large tier)")
    return render_node_pool(
        NodePoolArgs(
            name=SERVE_NODE_POOL,
            node_class=args.node_class,
            instance_types=[args.instance_type],
            spot=args.capacity_type == "spot",
            on_demand_fallback=args.capacity_type == "spot",
            pool=SERVE_POOL,
            cpu_limit=str(shape.vcpus * nodes),
            memory_limit=f"{shape.memory_gib * nodes}Gi",
            gpu_limit=shape.gpus * nodes,
        )
    )


class Serving(pulumi.ComponentResource):
    """Outputs: the serve Service's in-cluster DNS name."""

    service_host: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: ServingArgs,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmbatch:serving:Serving", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        waits: list[pulumi.Resource] = list(args.depends_on)
        if args.node_class is None:
            if args.node_role is None:
                raise ValueError("the medium tier's endpoint needs the node role for its own node group")
            lt = launch_template(f"{name}-gpu", args.volume_gib, args.tags, self, key_arn=args.volume_key_arn)
            group = eks.ManagedNodeGroup(
                f"{name}-gpu",
                cluster=args.cluster,
                node_group_name=f"{args.cluster_name}-serve",
                node_role=args.node_role,
                subnet_ids=args.private_subnet_ids,
                ami_type=versions.EKS_GPU_AMI_TYPE,
                version=args.kubernetes_version,
                capacity_type="SPOT" if args.capacity_type == "spot" else "ON_DEMAND",
                instance_types=[args.instance_type],
                # 0 until Ray asks for a replica's worker; the cluster autoscaler sizes it, so Pulumi leaves it be.
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                    min_size=0, desired_size=0, max_size=args.max_workers
                ),
                ignore_scaling_changes=True,
                launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=lt.id, version=lt.latest_version.apply(str)),
                labels={POOL_LABEL: SERVE_POOL},
                taints=[aws.eks.NodeGroupTaintArgs(key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect="NO_SCHEDULE")],
                tags=args.tags,
                opts=child,
            )
            waits.append(group)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=waits)
        if args.node_class is not None:
            pool = serve_node_pool(args)
            k8s.apiextensions.CustomResource(
                f"{name}-nodepool",
                api_version=pool["apiVersion"],
                kind=pool["kind"],
                metadata=pool["metadata"],
                spec=pool["spec"],
                opts=k8s_opts,
            )
        # The RayService's clusters (two while KubeRay upgrades it) admit only their own pods on Ray's ports, the
        # operator on the job API and the Serve port, and the VPC on the Serve port (infra/k8s/network_policy.py).
        cluster = args.pod_labels[CLUSTER_LABEL]
        policies: dict[str, tuple[str, pulumi.Input[Manifest]]] = {
            "serve-ingress": (
                "rayservice-serve-ingress",
                pulumi.Output.from_input(args.vpc_cidr).apply(lambda cidr: serve_ingress(cidr, args.pod_labels)),
            ),
            "ray-cluster-ingress": ("rayservice-ingress", ray_cluster_ingress(cluster)),
            "ray-head-ingress": (
                "rayservice-head-ingress",
                ray_head_ingress(cluster, OPERATOR_NAMESPACE, submitter=False, serve=True),
            ),
        }
        declare_network_policies(name, args.namespace, policies, k8s_opts)
        manifest = args.rayservice
        k8s.apiextensions.CustomResource(
            f"{name}-rayservice",
            api_version=RAY_API_VERSION,
            kind="RayService",
            metadata=manifest.apply(lambda m: m["metadata"]),
            spec=manifest.apply(lambda m: m["spec"]),
            opts=k8s_opts,
        )
        self.service_host = manifest.apply(
            lambda m: f"{m['metadata']['name']}-serve-svc.{m['metadata']['namespace']}.svc.cluster.local"
        )
        self.register_outputs({"service_host": self.service_host})
