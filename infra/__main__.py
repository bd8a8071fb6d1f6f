"""The Pulumi program: load the stack's config, build one component per concern, export what operators need.

Pulumi runs `main: infra/` with infra/ as the working directory and on sys.path, so the repository root is
put on sys.path to import the `infra` and `workload` packages by their full names.
"""

import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra import aws_context, deploy_route, facts, naming
from infra.components import storage
from infra.components.alerts import Alerts, AlertsArgs
from infra.components.batch_api import (
    BATCH_INPUT_PREFIX,
    BATCH_OUTPUT_PREFIX,
    BatchApi,
    BatchApiArgs,
    bundle_archive,
)
from infra.components.cluster_autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from infra.components.cost_controls import CostControls, CostControlsArgs
from infra.components.device_plugin import NvidiaDevicePlugin
from infra.components.eks_cluster import EksCluster, EksClusterArgs
from infra.components.image import WorkloadImage, WorkloadImageArgs
from infra.components.job_access import JobAccess, JobAccessArgs, static_prefix
from infra.components.job_identity import JobIdentity, JobIdentityArgs
from infra.components.karpenter import Karpenter, KarpenterArgs
from infra.components.kms import EncryptionKey, EncryptionKeyArgs
from infra.components.kuberay import KubeRayOperator
from infra.components.network import Network, NetworkArgs
from infra.components.nightly import RUN_REQUEST_KEY, EksTarget, Nightly, ca_of, nightly_args
from infra.components.node_groups import NodeGroups, NodeGroupsArgs
from infra.components.observability import Observability, ObservabilityArgs
from infra.components.providers import Providers, ProvidersArgs
from infra.components.secrets import JobSecrets, JobSecretsArgs, serve_api_keys_name
from infra.components.serving import Serving, ServingArgs
from infra.components.spot_node import SpotNode, SpotNodeArgs
from infra.config import from_pulumi
from infra.eks_job import RAYJOB_NAME, base_rayjob_args
from infra.eks_serve import RAYSERVICE_NAME, rayservice_manifest, serve_worker_ceiling
from infra.k8s.karpenter import DISCOVERY_TAG
from infra.k8s.network_policy import SERVE_PORT
from infra.k8s.rayservice import pod_labels
from infra.nightly_template import night_template_json
from infra.pricing import stack_costs
from infra.statemachines import timing
from workload.contract.config import render_config

stack = pulumi.get_stack()
config = from_pulumi()
tags = naming.cost_tags(stack, config)
if (price_warning := stack_costs.price_warning(config)) is not None:
    pulumi.log.warn(price_warning)
# Before any resource: an `up` that could not reach the cluster's API must not create half a stack, nor one
# whose alerts go to a placeholder address, nor one that requires the policy pack and runs without it.
offline, dry_run = deploy_route.under_offline_plan(), pulumi.runtime.is_dry_run()
deploy_route.require_route(config, offline=offline, dry_run=dry_run)
deploy_route.require_alert_email(config, offline=offline, dry_run=dry_run)
deploy_route.require_policy_pack(config, offline=offline, dry_run=dry_run)
# Facts that age: the version's support window, and tables not checked against their source for a while.
for line in facts.calendar_warnings(None if config.tier == "small" else config.eks.version, datetime.now(UTC).date()):
    pulumi.log.warn(line)

providers = Providers("providers", ProvidersArgs(region=config.region, tags=tags))
aws_opts = pulumi.ResourceOptions(provider=providers.aws)
context = aws_context.lookup(providers.aws)

# Node volumes are encrypted with the stack key. EC2 Auto Scaling launches the small tier's Spot node and every
# EKS managed node group's nodes as its service-linked role, which only the key policy can let in; Karpenter
# launches with its controller's role, which the key reaches through IAM (infra/components/karpenter.py).
volume_launchers = [aws_context.service_linked_role_arn(providers.aws)]
key = EncryptionKey(
    "kms", EncryptionKeyArgs(stack=stack, context=context, launcher_role_arns=volume_launchers), aws_opts
)
data = storage.DataBucket(
    "storage",
    storage.DataBucketArgs(
        stack=stack,
        context=context,
        key_arn=key.key_arn,
        glacier_after_days=config.storage.glacier_after_days,
        noncurrent_expire_days=config.storage.noncurrent_expire_days,
        archive_prefixes=config.storage.archive_prefixes,
        force_destroy=config.storage.force_destroy,
    ),
    aws_opts,
)
image = WorkloadImage(
    "image",
    WorkloadImageArgs(
        stack=stack,
        key_arn=key.key_arn,
        keep_last_images=config.image.keep_last_images,
        repository_name=config.image.repository_name,
        force_delete=config.image.force_delete,
    ),
    aws_opts,
)
alerts = Alerts(
    "alerts",
    AlertsArgs(stack=stack, context=context, key_arn=key.key_arn, email=config.alert_email),
    aws_opts,
)
CostControls("cost", CostControlsArgs.from_config(stack, config, context, alerts.topic_arn, key.key_arn), aws_opts)
cluster_name = naming.prefix(stack)  # the EKS tiers' cluster
network = Network(
    "network",
    NetworkArgs(
        stack=stack,
        context=context,
        vpc_cidr=config.network.vpc_cidr,
        az_count=config.network.az_count,
        single_nat_gateway=config.network.single_nat_gateway,
        interface_endpoints=config.network.interface_endpoints,
        egress=config.network.egress,
        nat_instance_type=config.network.nat_instance_type,
        key_arn=key.key_arn,
        existing_vpc_id=config.network.existing_vpc_id,
        existing_private_subnet_ids=config.network.existing_private_subnet_ids,
        # Karpenter finds the subnets it may use by this tag; on subnets the program creates it is theirs.
        private_subnet_tags=(
            {DISCOVERY_TAG: cluster_name} if config.tier != "small" and config.eks.karpenter_enabled else {}
        ),
        required_instance_types=config.zone_instance_types[0],
        preferred_instance_types=config.zone_instance_types[1],
    ),
    aws_opts,
)
job_settings = data.bucket_name.apply(
    lambda bucket: render_config(
        config.job_config(
            f"s3://{bucket}/{config.job.input_prefix}",
            f"s3://{bucket}/{config.job.output_prefix}",
            stack=stack,
            price_per_hour_usd=stack_costs.run_price_per_hour_usd(config),
        )
    )
)
secrets = JobSecrets(
    "secrets",
    JobSecretsArgs(
        stack=stack,
        key_arn=key.key_arn,
        job_settings=job_settings,
        hub_token=pulumi.Config().get_secret("hub_token"),
        serve_api_keys_name=(
            # The endpoint's keys are the Batch API's too (one secret, one set of keys per stack).
            serve_api_keys_name(stack, config.serve.api_keys_secret_name)
            if config.serve.enabled or config.batch_api.enabled
            else None
        ),
    ),
    aws_opts,
)
job_access = JobAccess(
    "job-access",
    JobAccessArgs(
        stack=stack,
        context=context,
        bucket_arn=data.bucket_arn,
        key_arn=key.key_arn,
        secret_arns=[
            secrets.job_settings_arn,
            secrets.hub_token_arn,
            *([secrets.serve_api_keys_arn] if secrets.serve_api_keys_arn is not None else []),
        ],
        read_prefixes=[
            static_prefix(config.job.input_prefix),
            storage.MODEL_PREFIX,
            static_prefix(RUN_REQUEST_KEY),  # the small node reads the night's date there
            *([BATCH_INPUT_PREFIX] if config.batch_api.enabled else []),  # a batch's file
        ],
        write_prefixes=[
            static_prefix(config.job.output_prefix),
            storage.CHECKPOINT_PREFIX,
            *([BATCH_OUTPUT_PREFIX] if config.batch_api.enabled else []),  # a batch's output, only
        ],
        image_repository_arn=image.repository_arn,
        metrics_namespace=config.monitoring.metrics_namespace,
        log_retention_days=config.monitoring.log_retention_days,
    ),
    aws_opts,
)
observability = Observability(
    "observability",
    ObservabilityArgs(
        stack=stack,
        context=context,
        topic_arn=alerts.topic_arn,
        log_group_name=job_access.log_group_name,
        monitoring=config.monitoring,
        billing_limit_usd=config.monitoring.billing_alarm_usd or config.cost.monthly_budget_usd,
        alert_email=config.alert_email,
        billing_provider=providers.billing,
        account_billing_alarm=config.monitoring.account_billing_alarm,
        serve=config.serve.watch if config.serve.enabled else None,
        batch_api=config.batch_api.enabled,
    ),
    aws_opts,
)

nightly_target = None  # the small tier's nightly run drives its Auto Scaling group directly
if config.tier == "small":
    node = SpotNode(
        "gpu-node",
        SpotNodeArgs(
            stack=stack,
            context=context,
            tags=tags,
            instance_type=config.small.instance_type,
            root_volume_gib=config.small.root_volume_gib,
            ami_ssm_parameter=config.small.gpu_ami_ssm_parameter,
            max_spot_price=config.small.max_spot_price,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids,
            key_arn=key.key_arn,
            job_policy_arn=job_access.policy_arn,
            image=image.image_ref,
            job_settings_secret_arn=secrets.job_settings_arn,
            hub_token_secret_arn=secrets.hub_token_arn,
            log_group_name=job_access.log_group_name,
            output_prefix_uri=data.bucket_name.apply(lambda bucket: f"s3://{bucket}/{config.job.output_prefix}"),
            run_request_uri=data.bucket_name.apply(lambda bucket: f"s3://{bucket}/{RUN_REQUEST_KEY}"),
            job_grace_period_s=config.job_grace_period_s,
            # With the Batch API the machine drains its queue on this boot: wait for its next run request.
            next_run_hold_s=(
                timing.next_run_hold_s(config.schedule.run_deadline_minutes) if config.batch_api.enabled else 0
            ),
        ),
        aws_opts,
    )
    pulumi.export("gpu_group_name", node.group_name)

if config.tier in ("medium", "large"):
    eks = config.eks
    cluster = EksCluster(
        "eks",
        EksClusterArgs(
            cluster_name=cluster_name,
            version=eks.version,
            support_type=eks.support_type,
            vpc_id=network.vpc_id,
            private_subnet_ids=network.private_subnet_ids,
            key_arn=key.key_arn,
            partition=context.partition,
            public_access_cidrs=eks.endpoint_public_access_cidrs,
            job_namespace=eks.namespace,
            tags=tags,
        ),
        aws_opts,
    )
    oidc = {"oidc_provider_arn": cluster.oidc_provider_arn, "oidc_provider_url": cluster.oidc_provider_url}
    nodes = NodeGroups(
        "nodes",
        NodeGroupsArgs(
            cluster=cluster.cluster,
            cluster_name=cluster_name,
            private_subnet_ids=network.private_subnet_ids,
            partition=context.partition,
            head_instance_type=eks.head_instance_type,
            head_nodes=eks.head_nodes,
            # Karpenter's head NodePool makes the large tier's head nodes; the autoscaler grows medium's group.
            head_group=not eks.karpenter_enabled,
            system_instance_type=eks.system_instance_type,
            system_volume_gib=eks.system_volume_gib,
            volume_gib=eks.node_volume_gib,
            volume_key_arn=key.key_arn,
            gpu_instance_type=None if eks.karpenter_enabled else eks.gpu_instance_type,
            gpu_max_nodes=eks.gpu_max_nodes,
            tags=tags,
            kubernetes_version=eks.version,
        ),
        aws_opts,
    )
    # Charts wait for their pods, which need the system node.
    k8s_opts = pulumi.ResourceOptions(provider=providers.aws, depends_on=[nodes])
    identity = JobIdentity(
        "job-identity",
        JobIdentityArgs(
            eks.namespace,
            eks.service_account,
            eks.worker_service_account,
            job_access.policy_arn,
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
                private_subnet_ids=network.private_subnet_ids,
                subnet_count=config.network.subnet_count,
                ami_alias=eks.ami_alias,
                volume_gib=eks.node_volume_gib,
                volume_key_arn=key.key_arn,
                node_pool=eks.node_pool,
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
    pulumi.export("cluster_name", cluster.cluster_name)
    pulumi.export("cluster_endpoint", cluster.endpoint)
    pulumi.export("oidc_provider_arn", cluster.oidc_provider_arn)
    pulumi.export("oidc_provider_url", cluster.oidc_provider_url)
    pulumi.export("submitter_security_group_id", cluster.submitter_security_group_id)
    pulumi.export("job_role_arn", identity.role_arn)
    pulumi.export("job_namespace", eks.namespace)
    # What each night's RayJob is rendered from, with the night's date filled in (infra.eks_job).
    rayjob_args = pulumi.Output.all(data.bucket_name, image.image_ref, secrets.hub_token_arn).apply(
        lambda values: base_rayjob_args(config, stack, values[1], values[0], values[2])
    )
    nightly_target = EksTarget(
        cluster_name=cluster_name,
        endpoint=cluster.endpoint,
        # The CA is public; only the kubeconfig around it is secret.
        certificate_authority=pulumi.Output.unsecret(cluster.kubeconfig.apply(ca_of)),
        namespace=eks.namespace,
        provider=cluster.provider,
        cluster=cluster.cluster,
        namespace_resource=identity.namespace,
        private_subnet_ids=network.private_subnet_ids,
        submitter_security_group_id=cluster.submitter_security_group_id,
        night_template_json=rayjob_args.apply(night_template_json),
        nodegroup_name=None if eks.karpenter_enabled else nodes.gpu_group_name,
        gpu_nodes=eks.gpu_max_nodes,
        karpenter_nodepool=eks.node_pool.name if eks.karpenter_enabled else None,
    )
    pulumi.export("rayjob_args", rayjob_args.apply(lambda args: args.model_dump_json()))
    if config.serve.enabled:
        serving = Serving(
            "serving",
            ServingArgs(
                cluster=cluster.cluster,
                cluster_name=cluster_name,
                namespace=eks.namespace,
                rayservice=pulumi.Output.all(image.image_ref, secrets.hub_token_arn, secrets.serve_api_keys_arn).apply(
                    lambda values: rayservice_manifest(config, stack, values[0], values[1], values[2])
                ),
                pod_labels=pod_labels(RAYSERVICE_NAME),
                vpc_cidr=network.vpc_cidr,
                instance_type=config.serve.instance_type,
                capacity_type=config.serve.capacity_type,
                max_workers=serve_worker_ceiling(config),
                gpus_per_worker=config.serve.worker_size.gpus,
                node_role=None if eks.karpenter_enabled else nodes.node_role,
                private_subnet_ids=network.private_subnet_ids,
                volume_gib=eks.node_volume_gib,
                volume_key_arn=key.key_arn,
                node_class=eks.node_pool.node_class if eks.karpenter_enabled else None,
                depends_on=[kuberay, identity, *([karpenter] if karpenter else [])],
                tags=tags,
                kubernetes_version=eks.version,
            ),
            cluster.provider,
            k8s_opts,
        )
        pulumi.export("serve_endpoint", serving.service_host.apply(lambda host: f"http://{host}:{SERVE_PORT}/v1"))

nightly = Nightly(
    "nightly",
    nightly_args(
        config,
        stack,
        context,
        bucket_name=data.bucket_name,
        key_arn=key.key_arn,
        alerts_topic_arn=alerts.topic_arn,
        eks=nightly_target,
    ),
    aws_opts,
)
pulumi.export("nightly_state_machine_arn", nightly.state_machine_arn)
if config.batch_api.enabled and secrets.serve_api_keys_arn is not None:
    batch_api = BatchApi(
        "batch-api",
        BatchApiArgs(
            stack=stack,
            context=context,
            bucket_name=data.bucket_name,
            key_arn=key.key_arn,
            keys_secret_arn=secrets.serve_api_keys_arn,
            state_machine_arn=nightly.state_machine_arn,
            model_name=config.job_config("s3://b/in/{date}/", "s3://b/out/{date}/", stack=stack).model.name,
            code=bundle_archive(dry_run or offline),  # an offline plan deploys nothing
            metrics_namespace=config.monitoring.metrics_namespace,
            log_retention_days=config.monitoring.log_retention_days,
            tick_minutes=config.batch_api.tick_minutes,
            memory_mb=config.batch_api.memory_mb,
            group_name=naming.gpu_group_name(stack) if config.tier == "small" else None,
            public_endpoint_acknowledged=config.batch_api.public_endpoint_acknowledged,
        ),
        aws_opts,
    )
    pulumi.export("batch_api_url", batch_api.url)
    pulumi.export("batch_api_tick_function_name", batch_api.tick_function_name)
pulumi.export("nightly_schedule", nightly.schedule_name)
pulumi.export("tier", config.tier)
pulumi.export("region", config.region)
pulumi.export("kms_key_arn", key.key_arn)
pulumi.export("data_bucket", data.bucket_name)
pulumi.export("alerts_topic_arn", alerts.topic_arn)
pulumi.export("image_ref", image.image_ref)
pulumi.export("vpc_id", network.vpc_id)
pulumi.export("private_subnet_ids", network.private_subnet_ids)
pulumi.export("job_policy_arn", job_access.policy_arn)
pulumi.export("job_log_group", job_access.log_group_name)
pulumi.export("dashboard", observability.dashboard_name)
