"""What every tier stands on: the stack key, the data bucket, the image, alerts and cost controls, the network,
the job's secrets and access, and the stack's alarms. The tiers' compute (SpotNode, EksTier) builds on top.

These resources were once built at the program's top level; each child here carries an alias to its old,
parentless URN so an `up` moves it under the component instead of replacing it (tests/infra/test_plan_urns.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra import aws_context
from infra.aws_context import AwsContext
from infra.components.alerts import Alerts, AlertsArgs
from infra.components.cost_controls import CostControls, CostControlsArgs
from infra.components.image import WorkloadImage, WorkloadImageArgs
from infra.components.job_access import JobAccess, JobAccessArgs
from infra.components.kms import EncryptionKey, EncryptionKeyArgs
from infra.components.network import Network, NetworkArgs
from infra.components.observability import Observability, ObservabilityArgs
from infra.components.providers import Providers
from infra.components.secrets import JobSecrets, JobSecretsArgs
from infra.components.storage import DataBucket, DataBucketArgs
from infra.config import StackConfig


@dataclass(frozen=True)
class FoundationArgs:
    stack: str
    config: StackConfig
    context: AwsContext
    providers: Providers


class Foundation(pulumi.ComponentResource):
    """Its parts as attributes (`key`, `data`, `image`, `alerts`, `network`, `secrets`, `job_access`,
    `observability`): the tiers and the nightly run read their outputs."""

    def __init__(self, name: str, args: FoundationArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:foundation:Foundation", name, None, opts)
        stack, config, context = args.stack, args.config, args.context
        provider = args.providers.aws
        # Parentless before: the alias keeps each child's URN (and so its children's) across the move.
        child = pulumi.ResourceOptions(parent=self, provider=provider, aliases=[pulumi.Alias(parent=None)])
        # Node volumes are encrypted with the stack key. EC2 Auto Scaling launches the small tier's Spot node and
        # every EKS managed node group's nodes as its service-linked role, which only the key policy can let in;
        # Karpenter launches with its controller's role, which the key reaches through IAM (components/karpenter.py).
        launchers = [aws_context.service_linked_role_arn(provider)]
        self.key = EncryptionKey(
            "kms",
            EncryptionKeyArgs(
                stack=stack, context=context, launcher_role_arns=launchers, eks_cluster_logs=config.tier != "small"
            ),
            child,
        )
        key_arn = self.key.key_arn
        self.data = DataBucket("storage", DataBucketArgs.from_config(stack, config, context, key_arn), child)
        self.image = WorkloadImage("image", WorkloadImageArgs.from_config(stack, config, key_arn), child)
        self.alerts = Alerts(
            "alerts", AlertsArgs(stack=stack, context=context, key_arn=key_arn, email=config.alert_email), child
        )
        CostControls(
            "cost",
            CostControlsArgs.from_config(stack, config, context, self.alerts.topic_arn, key_arn, self.data.bucket_name),
            child,
        )
        self.network = Network("network", NetworkArgs.from_config(stack, config, context, key_arn), child)
        self.secrets = JobSecrets(
            "secrets", JobSecretsArgs.from_config(stack, config, key_arn, self.data.bucket_name), child
        )
        secrets = self.secrets
        # No API key among them (issue 60): the job's role is the GPU node's instance role on the small tier and
        # the nightly pods' on EKS; the endpoint's replicas read its keys with roles of their own (serve_identity).
        secret_arns = [secrets.job_settings_arn, secrets.hub_token_arn]
        self.job_access = JobAccess(
            "job-access",
            JobAccessArgs.from_config(
                stack, config, context, self.data.bucket_arn, key_arn, secret_arns, self.image.repository_arn
            ),
            child,
        )
        self.observability = Observability(
            "observability",
            ObservabilityArgs.from_config(
                stack, config, context, self.alerts.topic_arn, self.job_access.log_group_name, args.providers.billing
            ),
            child,
        )
        self.register_outputs({"key_arn": key_arn, "bucket_name": self.data.bucket_name})
