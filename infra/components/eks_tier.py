"""The medium and large tiers' compute: the EKS cluster and its node groups, the job's identity, the KubeRay
operator, the NVIDIA device plugin, Karpenter (large) or the Cluster Autoscaler (medium), and the online
endpoint when `serve.enabled`. `target` is where the nightly run submits its RayJob.

These resources were once built at the program's top level; each child here carries an alias to its old,
parentless URN so an `up` moves it under the component instead of replacing it (tests/infra/test_plan_urns.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi

from infra import naming
from infra.aws_context import AwsContext
from infra.components.cluster_autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from infra.components.device_plugin import NvidiaDevicePlugin
from infra.components.eks_cluster import EksCluster, EksClusterArgs
from infra.components.foundation import Foundation
from infra.components.job_identity import JobIdentity, JobIdentityArgs
from infra.components.karpenter import Karpenter, KarpenterArgs
from infra.components.kuberay import KubeRayOperator
from infra.components.nightly import EksTarget, ca_of
from infra.components.node_groups import NodeGroups, NodeGroupsArgs
from infra.components.providers import Providers
from infra.components.serve_identity import ServeIdentity, ServeIdentityArgs
from infra.components.serving import Serving, ServingArgs
from infra.config import StackConfig
from infra.config.worker_groups import gpu_node_pool_names
from infra.eks_job import RAYJOB_NAME, base_rayjob_args
from infra.eks_serve import RAYSERVICE_NAME, rayservice_manifest, serve_worker_ceiling
from infra.k8s.network_policy import SERVE_PORT
from infra.k8s.rayservice import pod_labels
from infra.nightly_template import night_template_json


@dataclass(frozen=True)
class EksTierArgs:
    stack: str
    config: StackConfig
    context: AwsContext
    tags: Mapping[str, str]
    base: Foundation
    providers: Providers


class EksTier(pulumi.ComponentResource):
    """`cluster`, `identity` (the job's role), `target` (the nightly run's EKS target), `rayjob_args` (JSON of
    what each night's RayJob is rendered from) and `serve_endpoint` (None without `serve.enabled`)."""

    serve_endpoint: pulumi.Output[str] | None

    def __init__(self, name: str, args: EksTierArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:eks_tier:EksTier", name, None, opts)
        stack, config, context, base = args.stack, args.config, args.context, args.base
        eks, tags, cluster_name = config.eks, dict(args.tags), naming.prefix(stack)
        subnets, key_arn = base.network.private_subnet_ids, base.key.key_arn
        # Parentless before: the alias keeps each child's URN (and so its children's) across the move.
        child = pulumi.ResourceOptions(parent=self, provider=args.providers.aws, aliases=[pulumi.Alias(parent=None)])
        cluster = self.cluster = EksCluster(
            "eks",
            EksClusterArgs(
                cluster_name=cluster_name,
                version=eks.version,
                support_type=eks.support_type,
                vpc_id=base.network.vpc_id,
                private_subnet_ids=subnets,
                key_arn=key_arn,
                partition=context.partition,
                public_access_cidrs=eks.endpoint_public_access_cidrs,
                job_namespace=eks.namespace,
                tags=tags,
                log_retention_days=config.monitoring.log_retention_days,
                log_group_name=naming.eks_cluster_log_group(stack),
            ),
            child,
        )
        oidc = {"oidc_provider_arn": cluster.oidc_provider_arn, "oidc_provider_url": cluster.oidc_provider_url}
        nodes = NodeGroups(
            "nodes",
            NodeGroupsArgs(
                cluster=cluster.cluster,
                cluster_name=cluster_name,
                private_subnet_ids=subnets,
                partition=context.partition,
                head_instance_type=eks.head_instance_type,
                head_nodes=eks.head_nodes,
                # Karpenter's head NodePool makes the large tier's head nodes; the autoscaler grows medium's group.
                head_group=not eks.karpenter_enabled,
                system_instance_type=eks.system_instance_type,
                system_volume_gib=eks.system_volume_gib,
                volume_gib=eks.node_volume_gib,
                volume_key_arn=key_arn,
                gpu_instance_type=None if eks.karpenter_enabled else eks.gpu_instance_type,
                gpu_max_nodes=eks.gpu_max_nodes,
                tags=tags,
                kubernetes_version=eks.version,
            ),
            child,
        )
        # Charts wait for their pods, which need the system node.
        k8s_opts = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[nodes]))
        identity = self.identity = JobIdentity(
            "job-identity",
            JobIdentityArgs(
                eks.namespace,
                eks.service_account,
                eks.worker_service_account,
                base.job_access.policy_arn,
                **oidc,
                nightly_cluster=RAYJOB_NAME,
            ),
            cluster.provider,
            k8s_opts,
        )
        kuberay = KubeRayOperator("kuberay", cluster.provider, k8s_opts)
        NvidiaDevicePlugin("nvidia-device-plugin", cluster.provider, k8s_opts)
        karpenter = None
        if eks.karpenter_enabled:
            karpenter = Karpenter(
                "karpenter",
                KarpenterArgs(
                    cluster_name=cluster_name,
                    context=context,
                    cluster_security_group_id=cluster.cluster_security_group_id,
                    private_subnet_ids=subnets,
                    subnet_count=config.network.subnet_count,
                    ami_alias=eks.ami_alias,
                    volume_gib=eks.node_volume_gib,
                    volume_key_arn=key_arn,
                    node_pool=eks.node_pool,
                    other_gpu_pools=(eks.eight_gpu.node_pool,) if eks.eight_gpu.enabled else (),
                    head_instance_type=eks.head_instance_type,
                    head_nodes=eks.head_nodes,
                    tag_existing_subnets=not config.network.create_vpc,
                    tags=tags,
                    **oidc,
                ),
                cluster.provider,
                k8s_opts,
            )
        else:
            ClusterAutoscaler(
                "cluster-autoscaler",
                ClusterAutoscalerArgs(
                    cluster_name=cluster_name,
                    context=context,
                    oidc_provider_arn=cluster.oidc_provider_arn,
                    oidc_provider_url=cluster.oidc_provider_url,
                    kubernetes_version=eks.version,
                ),
                cluster.provider,
                k8s_opts,
            )
        data, image, secrets = base.data, base.image, base.secrets
        # What each night's RayJob is rendered from, with the night's date filled in (infra.eks_job).
        rayjob_args = pulumi.Output.all(data.bucket_name, image.image_ref, secrets.hub_token_arn).apply(
            lambda values: base_rayjob_args(config, stack, values[1], values[0], values[2])
        )
        self.rayjob_args = rayjob_args.apply(lambda rendered: rendered.model_dump_json())
        self.target = EksTarget(
            cluster_name=cluster_name,
            endpoint=cluster.endpoint,
            # The CA is public; only the kubeconfig around it is secret.
            certificate_authority=pulumi.Output.unsecret(cluster.kubeconfig.apply(ca_of)),
            namespace=eks.namespace,
            provider=cluster.provider,
            cluster=cluster.cluster,
            namespace_resource=identity.namespace,
            private_subnet_ids=subnets,
            submitter_security_group_id=cluster.submitter_security_group_id,
            night_template_json=rayjob_args.apply(night_template_json),
            nodegroup_name=None if eks.karpenter_enabled else nodes.gpu_group_name,
            gpu_nodes=eks.gpu_max_nodes,
            # Every GPU NodePool of the night's groups (Spot and fallback), comma-separated: the release empties all.
            karpenter_nodepool=",".join(gpu_node_pool_names(eks)) if eks.karpenter_enabled else None,
        )
        self.serve_endpoint = None
        if config.serve.enabled and secrets.serve_api_keys_arn is not None:
            serve_identity = ServeIdentity(
                "serve-identity",
                ServeIdentityArgs(eks.namespace, base.job_access.policy_arn, secrets.serve_api_keys_arn, **oidc),
                cluster.provider,
                pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[identity])),
            )
            serving = Serving(
                "serving",
                ServingArgs(
                    cluster=cluster.cluster,
                    cluster_name=cluster_name,
                    namespace=eks.namespace,
                    rayservice=pulumi.Output.all(
                        image.image_ref, secrets.hub_token_arn, secrets.serve_api_keys_arn
                    ).apply(lambda values: rayservice_manifest(config, stack, values[0], values[1], values[2])),
                    pod_labels=pod_labels(RAYSERVICE_NAME),
                    vpc_cidr=base.network.vpc_cidr,
                    instance_type=config.serve.instance_type,
                    capacity_type=config.serve.capacity_type,
                    max_workers=serve_worker_ceiling(config),
                    gpus_per_worker=config.serve.worker_size.gpus,
                    node_role=None if eks.karpenter_enabled else nodes.node_role,
                    private_subnet_ids=subnets,
                    volume_gib=eks.node_volume_gib,
                    volume_key_arn=key_arn,
                    node_class=eks.node_pool.node_class if eks.karpenter_enabled else None,
                    depends_on=[kuberay, identity, serve_identity, *([karpenter] if karpenter else [])],
                    tags=tags,
                    kubernetes_version=eks.version,
                ),
                cluster.provider,
                k8s_opts,
            )
            self.serve_endpoint = serving.service_host.apply(lambda host: f"http://{host}:{SERVE_PORT}/v1")
        self.register_outputs({"cluster_name": cluster.cluster_name, "rayjob_args": self.rayjob_args})
