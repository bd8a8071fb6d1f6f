"""The Pulumi program: load the stack's config, build one component per concern, export what operators need.

Pulumi runs `main: infra/` with infra/ as the working directory and on sys.path, so the repository root is
put on sys.path to import the `infra` and `workload` packages by their full names.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra import aws_context, naming
from infra.components import storage
from infra.components.alerts import Alerts, AlertsArgs
from infra.components.job_access import JobAccess, JobAccessArgs, static_prefix
from infra.components.kms import EncryptionKey, EncryptionKeyArgs
from infra.components.network import Network, NetworkArgs
from infra.components.providers import Providers, ProvidersArgs
from infra.components.secrets import JobSecrets, JobSecretsArgs
from infra.components.spot_node import SpotNode, SpotNodeArgs
from infra.config import from_pulumi
from workload.config import render_config

stack = pulumi.get_stack()
config = from_pulumi()
tags = naming.cost_tags(stack, config)

providers = Providers("providers", ProvidersArgs(region=config.region, tags=tags))
aws_opts = pulumi.ResourceOptions(provider=providers.aws)
context = aws_context.lookup(providers.aws)

# The job image; the image component supplies it once it exists (same repository name and tag).
image_repository_arn = context.arn("ecr", f"repository/{config.image.repository_name}")
image = f"{context.ecr_registry}/{config.image.repository_name}:{config.image.tag}"

key = EncryptionKey("kms", EncryptionKeyArgs(stack=stack, context=context), aws_opts)
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
alerts = Alerts(
    "alerts",
    AlertsArgs(stack=stack, context=context, key_arn=key.key_arn, email=config.alert_email),
    aws_opts,
)
network = Network(
    "network",
    NetworkArgs(
        stack=stack,
        context=context,
        vpc_cidr=config.network.vpc_cidr,
        az_count=config.network.az_count,
        single_nat_gateway=config.network.single_nat_gateway,
        interface_endpoints=config.network.interface_endpoints,
        existing_vpc_id=config.network.existing_vpc_id,
        existing_private_subnet_ids=config.network.existing_private_subnet_ids,
    ),
    aws_opts,
)
job_settings = data.bucket_name.apply(
    lambda bucket: render_config(
        config.job_config(
            f"s3://{bucket}/{config.job.input_prefix}",
            f"s3://{bucket}/{config.job.output_prefix}",
            stack=stack,
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
        secret_arns=[secrets.job_settings_arn, secrets.hub_token_arn],
        read_prefixes=[static_prefix(config.job.input_prefix), storage.MODEL_PREFIX],
        write_prefixes=[static_prefix(config.job.output_prefix), storage.CHECKPOINT_PREFIX],
        image_repository_arn=image_repository_arn,
        metrics_namespace=config.monitoring.metrics_namespace,
        log_retention_days=config.monitoring.log_retention_days,
    ),
    aws_opts,
)

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
            image=image,
            job_settings_secret_arn=secrets.job_settings_arn,
            hub_token_secret_arn=secrets.hub_token_arn,
            log_group_name=job_access.log_group_name,
        ),
        aws_opts,
    )
    pulumi.export("gpu_group_name", node.group_name)

pulumi.export("tier", config.tier)
pulumi.export("region", config.region)
pulumi.export("kms_key_arn", key.key_arn)
pulumi.export("data_bucket", data.bucket_name)
pulumi.export("alerts_topic_arn", alerts.topic_arn)
pulumi.export("vpc_id", network.vpc_id)
pulumi.export("private_subnet_ids", network.private_subnet_ids)
pulumi.export("job_policy_arn", job_access.policy_arn)
pulumi.export("job_log_group", job_access.log_group_name)
