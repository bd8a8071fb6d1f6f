"""The job's identity in the cluster: its namespace, its service account and the IAM role behind it (IRSA).

The role grants what the job does and nothing else: read inputs and models, write outputs and checkpoints in
the data bucket, use the stack's KMS key for them, and publish its metrics and logs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components import irsa
from infra.components.storage import CHECKPOINT_PREFIX, INPUT_PREFIX, MODEL_PREFIX, OUTPUT_PREFIX
from infra.k8s.common import base_labels


@dataclass(frozen=True)
class JobIdentityArgs:
    namespace: str
    service_account: str
    bucket_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_group_arn: str
    metrics_namespace: str
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]


def job_policy(bucket_arn: str, key_arn: str, log_group_arn: str, metrics_namespace: str) -> dict[str, Any]:
    """Least privilege for one batch run; S3 actions are limited to the job's own prefixes."""
    readable = [INPUT_PREFIX, MODEL_PREFIX, OUTPUT_PREFIX, CHECKPOINT_PREFIX]
    writable = [OUTPUT_PREFIX, CHECKPOINT_PREFIX]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ListJobPrefixes",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in readable]}},
            },
            {
                "Sid": "ReadJobData",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": [f"{bucket_arn}/{prefix}*" for prefix in readable],
            },
            {
                # Delete: resume mode 'restart' clears a run's old output; commits replace marker files.
                "Sid": "WriteResults",
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"{bucket_arn}/{prefix}*" for prefix in writable],
            },
            {
                "Sid": "UseDataKey",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
                "Resource": key_arn,
            },
            {
                "Sid": "PublishMetrics",
                "Effect": "Allow",
                "Action": "cloudwatch:PutMetricData",
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:namespace": metrics_namespace}},
            },
            {
                "Sid": "ShipLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": [log_group_arn, f"{log_group_arn}:*"],
            },
        ],
    }


class JobIdentity(pulumi.ComponentResource):
    """Namespace, service account annotated with its role, and the role."""

    role_arn: pulumi.Output[str]
    namespace: str
    service_account: str

    def __init__(
        self,
        name: str,
        args: JobIdentityArgs,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmbatch:job_identity:JobIdentity", name, None, opts)
        policy = pulumi.Output.all(args.bucket_arn, args.key_arn).apply(
            lambda arns: json.dumps(job_policy(arns[0], arns[1], args.log_group_arn, args.metrics_namespace))
        )
        role = irsa.service_account_role(
            f"{name}-job",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace=args.namespace,
            service_account=args.service_account,
            policy=policy,
            parent=self,
        )
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.namespace, labels=base_labels("namespace")),
            opts=k8s_opts,
        )
        k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.service_account,
                namespace=args.namespace,
                labels=base_labels("job"),
                annotations={"eks.amazonaws.com/role-arn": role.arn},
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace]),
        )
        self.role_arn = role.arn
        self.namespace = args.namespace
        self.service_account = args.service_account
        self.register_outputs({"role_arn": self.role_arn})
