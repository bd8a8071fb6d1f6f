"""What the batch job may do, as one customer-managed IAM policy every tier attaches to the job's identity.

Only its bucket prefixes (the images' too, where `job.image_prefix` names one), its key, its two secrets, its log
group, its image repository and its metrics namespace. The small tier attaches it to the GPU node's role; the EKS
tiers to the job's pod role.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.batch_api import BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX
from infra.components.iam import via_services
from infra.components.nightly import RUN_REQUEST_KEY
from infra.components.storage import CHECKPOINT_PREFIX, MODEL_PREFIX
from infra.config import StackConfig


@dataclass(frozen=True)
class JobAccessArgs:
    stack: str
    context: AwsContext
    bucket_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    secret_arns: Sequence[pulumi.Input[str]]
    read_prefixes: Sequence[str]  # e.g. input/, models/, and job.image_prefix where the stack names one
    write_prefixes: Sequence[str]  # e.g. output/, checkpoints/ (also read back on resume)
    image_repository_arn: pulumi.Input[str]
    metrics_namespace: str
    log_retention_days: int

    @classmethod
    def from_config(
        cls,
        stack: str,
        config: StackConfig,
        context: AwsContext,
        bucket_arn: pulumi.Input[str],
        key_arn: pulumi.Input[str],
        secret_arns: Sequence[pulumi.Input[str]],
        image_repository_arn: pulumi.Input[str],
    ) -> JobAccessArgs:
        """The prefixes the job reads and writes, from the stack's job prefixes and whether the Batch API is on."""
        batch_api = config.batch_api.enabled
        return cls(
            stack=stack,
            context=context,
            bucket_arn=bucket_arn,
            key_arn=key_arn,
            secret_arns=secret_arns,
            read_prefixes=[
                static_prefix(config.job.input_prefix),
                MODEL_PREFIX,
                static_prefix(RUN_REQUEST_KEY),  # the small node reads the night's date there
                *([BATCH_INPUT_PREFIX] if batch_api else []),  # a batch's file
                # The nightly's images (job.image_prefix): that prefix only, never the bucket.
                *([config.job.image_prefix] if config.job.image_prefix is not None else []),
            ],
            write_prefixes=[
                static_prefix(config.job.output_prefix),
                CHECKPOINT_PREFIX,
                *([BATCH_OUTPUT_PREFIX] if batch_api else []),  # a batch's output, only
            ],
            image_repository_arn=image_repository_arn,
            metrics_namespace=config.monitoring.metrics_namespace,
            log_retention_days=config.monitoring.log_retention_days,
        )


def static_prefix(template: str) -> str:
    """The fixed part of a key prefix template: `input/{date}/` -> `input/`."""
    head = template.split("{", 1)[0]
    return head if head.endswith("/") or not head else head.rsplit("/", 1)[0] + "/"


def job_policy(
    *,
    bucket_arn: str,
    key_arn: str,
    secret_arns: Sequence[str],
    read_prefixes: Sequence[str],
    write_prefixes: Sequence[str],
    log_group_arn: str,
    repository_arn: str,
    metrics_namespace: str,
) -> dict[str, Any]:
    """The job's policy document; every statement names its resources except where AWS has none."""
    readable = sorted({*read_prefixes, *write_prefixes})
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ListOwnPrefixes",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in readable]}},
            },
            {
                # A GetBucketLocation request has no s3:prefix, so under the condition above it could never be
                # allowed; it reveals only the bucket's region (pyarrow's S3 filesystem asks for it).
                "Sid": "FindBucketRegion",
                "Effect": "Allow",
                "Action": ["s3:GetBucketLocation"],
                "Resource": bucket_arn,
            },
            {
                "Sid": "ReadInputsModelsAndOwnOutputs",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{bucket_arn}/{prefix}*" for prefix in readable],
            },
            {
                "Sid": "WriteOutputsAndCheckpoints",
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"{bucket_arn}/{prefix}*" for prefix in sorted(write_prefixes)],
            },
            {
                # Objects (SSE-KMS) and secrets are the job's only uses of the key; never direct.
                "Sid": "UseStackKey",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
                "Resource": key_arn,
                "Condition": via_services(key_arn, "s3", "secretsmanager"),
            },
            {
                "Sid": "ReadJobSecrets",
                "Effect": "Allow",
                "Action": ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
                "Resource": list(secret_arns),
            },
            {
                "Sid": "WriteJobLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": [log_group_arn, f"{log_group_arn}:log-stream:*"],
            },
            {
                "Sid": "PublishJobMetrics",
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricData"],
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:namespace": metrics_namespace}},
            },
            {
                "Sid": "RegistryLogin",
                "Effect": "Allow",
                "Action": ["ecr:GetAuthorizationToken"],
                "Resource": "*",
            },
            {
                "Sid": "PullJobImage",
                "Effect": "Allow",
                "Action": [
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchCheckLayerAvailability",
                ],
                "Resource": repository_arn,
            },
        ],
    }


class JobAccess(pulumi.ComponentResource):
    """`policy_arn`: the job's permissions; `log_group_name`/`log_group_arn`: where the job logs (KMS)."""

    policy_arn: pulumi.Output[str]
    log_group_name: pulumi.Output[str]
    log_group_arn: pulumi.Output[str]

    def __init__(self, name: str, args: JobAccessArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:job_access:JobAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        logs = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=naming.job_log_group(args.stack),
            retention_in_days=args.log_retention_days,
            kms_key_id=args.key_arn,
            opts=child,
        )
        document = pulumi.Output.all(
            args.bucket_arn, args.key_arn, logs.arn, args.image_repository_arn, *args.secret_arns
        ).apply(
            lambda values: json.dumps(
                job_policy(
                    bucket_arn=values[0],
                    key_arn=values[1],
                    log_group_arn=values[2],
                    repository_arn=values[3],
                    secret_arns=values[4:],
                    read_prefixes=args.read_prefixes,
                    write_prefixes=args.write_prefixes,
                    metrics_namespace=args.metrics_namespace,
                )
            )
        )
        policy = aws.iam.Policy(
            f"{name}-policy",
            name=naming.child(args.stack, "job"),
            description="llm-batch job: its bucket prefixes, key, secrets, logs, image and metrics only",
            policy=document,
            opts=child,
        )
        self.policy_arn = policy.arn
        self.log_group_name = logs.name
        self.log_group_arn = logs.arn
        self.register_outputs({"policy_arn": self.policy_arn, "log_group_name": self.log_group_name})
