"""The Pulumi program: load the stack's config, build one component per concern, export what operators need.

Pulumi runs `main: infra/` with infra/ as the working directory and on sys.path, so the repository root is
put on sys.path to import the `infra` and `workload` packages by their full names.
"""

import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra import aws_context, deploy_route, facts, naming, role_boundary
from infra.components.batch_api import BatchApi, BatchApiArgs, bundle_archive
from infra.components.eks_tier import EksTier, EksTierArgs
from infra.components.foundation import Foundation, FoundationArgs
from infra.components.nightly import Nightly, nightly_args
from infra.components.providers import Providers, ProvidersArgs
from infra.components.spot_node import SpotNode, SpotNodeArgs
from infra.config import from_pulumi
from infra.pricing import stack_costs

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
role_boundary.require_boundary(context)  # before any component: every role it creates gets the boundary
base = Foundation("foundation", FoundationArgs(stack, config, context, providers), aws_opts)
key, data, secrets = base.key, base.data, base.secrets

exports: dict[str, object] = {}
eks_target = None  # the small tier's nightly run drives its Auto Scaling group directly
if config.tier == "small":
    node = SpotNode("gpu-node", SpotNodeArgs.from_config(stack, config, context, tags, base), aws_opts)
    exports["gpu_group_name"] = node.group_name
else:
    tier = EksTier("eks-tier", EksTierArgs(stack, config, context, tags, base, providers), aws_opts)
    cluster, eks_target = tier.cluster, tier.target
    exports |= {
        "cluster_name": cluster.cluster_name,
        "cluster_endpoint": cluster.endpoint,
        "oidc_provider_arn": cluster.oidc_provider_arn,
        "oidc_provider_url": cluster.oidc_provider_url,
        "submitter_security_group_id": cluster.submitter_security_group_id,
        "job_role_arn": tier.identity.role_arn,
        "job_namespace": config.eks.namespace,
        "rayjob_args": tier.rayjob_args,
    }
    if tier.serve_endpoint is not None:
        exports["serve_endpoint"] = tier.serve_endpoint

nightly = Nightly(
    "nightly",
    nightly_args(
        config,
        stack,
        context,
        bucket_name=data.bucket_name,
        key_arn=key.key_arn,
        alerts_topic_arn=base.alerts.topic_arn,
        eks=eks_target,
    ),
    aws_opts,
)
exports["nightly_state_machine_arn"] = nightly.state_machine_arn
if config.batch_api.enabled:
    batch_api = BatchApi(
        "batch-api",
        BatchApiArgs.from_config(
            stack,
            config,
            context,
            data.bucket_name,
            key.key_arn,
            nightly.state_machine_arn,
            code=bundle_archive(dry_run or offline),  # an offline plan deploys nothing
        ),
        aws_opts,
    )
    exports |= {"batch_api_url": batch_api.url, "batch_api_tick_function_name": batch_api.tick_function_name}
exports |= {
    "nightly_schedule": nightly.schedule_name,
    "tier": config.tier,
    "region": config.region,
    "kms_key_arn": key.key_arn,
    "data_bucket": data.bucket_name,
    "alerts_topic_arn": base.alerts.topic_arn,
    "image_ref": base.image.image_ref,
    "vpc_id": base.network.vpc_id,
    "private_subnet_ids": base.network.private_subnet_ids,
    "job_policy_arn": base.job_access.policy_arn,
    "job_log_group": base.job_access.log_group_name,
    "dashboard": base.observability.dashboard_name,
}
for name, value in exports.items():
    pulumi.export(name, value)
