"""The job's S3 bucket (inputs, outputs, checkpoints, models): KMS-encrypted, never public."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.bucket_retention import retention_rules
from infra.components.iam import deny_insecure_transport
from infra.config import StackConfig

# Where things live in the bucket; the job's IAM policy grants exactly these.
INPUT_PREFIX = "input/"
OUTPUT_PREFIX = "output/"
CHECKPOINT_PREFIX = "checkpoints/"
MODEL_PREFIX = "models/"


@dataclass(frozen=True)
class DataBucketArgs:
    stack: str
    context: AwsContext
    key_arn: pulumi.Input[str]
    glacier_after_days: int
    noncurrent_expire_days: int
    archive_prefixes: Sequence[str]
    force_destroy: bool = False
    # The name's suffix: another concern needing a bucket (e.g. reports) reuses this component with its own.
    purpose: str = "data"

    @classmethod
    def from_config(
        cls, stack: str, config: StackConfig, context: AwsContext, key_arn: pulumi.Input[str]
    ) -> DataBucketArgs:
        """The stack's data bucket: input, output, checkpoints and models, under the stack key."""
        return cls(
            stack=stack,
            context=context,
            key_arn=key_arn,
            glacier_after_days=config.storage.glacier_after_days,
            noncurrent_expire_days=config.storage.noncurrent_expire_days,
            archive_prefixes=config.storage.archive_prefixes,
            force_destroy=config.storage.force_destroy,
        )


def tls_only_policy(bucket_arn: str) -> dict[str, Any]:
    """Deny every request that is not over TLS (1.2 or later), for the bucket and its objects."""
    resources = [bucket_arn, f"{bucket_arn}/*"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            deny_insecure_transport("s3:*", resources),
            {
                "Sid": "DenyOutdatedTls",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": resources,
                "Condition": {"NumericLessThan": {"s3:TlsVersion": "1.2"}},
            },
        ],
    }


class DataBucket(pulumi.ComponentResource):
    """Versioned, SSE-KMS with a bucket key, public access fully blocked, TLS only, archived to Glacier; what the
    Batch API and the queue delete really goes (infra/components/bucket_retention.py)."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]

    def __init__(self, name: str, args: DataBucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:storage:DataBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Account and region in the name: bucket names are global, and this one must be the same on every up.
        physical = f"{naming.child(args.stack, args.purpose)}-{args.context.account_id}-{args.context.region}"
        if len(physical) > 63:
            raise ValueError(f"bucket name {physical} is longer than S3's 63 characters: use a shorter stack name")
        bucket = aws.s3.Bucket(f"{name}-bucket", bucket=physical, force_destroy=args.force_destroy, opts=child)
        deps = pulumi.ResourceOptions(parent=self, depends_on=[bucket])
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=deps,
        )
        public_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access-block",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=deps,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=args.key_arn
                    ),
                    # One data key per bucket, not per object: cuts KMS requests (and their cost).
                    bucket_key_enabled=True,
                )
            ],
            opts=deps,
        )
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=deps,
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=bucket.arn.apply(lambda arn: json.dumps(tls_only_policy(arn))),
            # A bucket policy put before the public access block can race it; order them.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_block]),
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.id,
            rules=self._lifecycle_rules(args),
            # Lifecycle rules on noncurrent versions need versioning in place first.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning]),
        )
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.register_outputs({"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn})

    @staticmethod
    def _lifecycle_rules(args: DataBucketArgs) -> list[aws.s3.BucketLifecycleConfigurationRuleArgs]:
        rules = [
            aws.s3.BucketLifecycleConfigurationRuleArgs(
                id=f"archive-{prefix.strip('/').replace('/', '-')}",
                status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=prefix),
                transitions=[
                    aws.s3.BucketLifecycleConfigurationRuleTransitionArgs(
                        days=args.glacier_after_days, storage_class="GLACIER"
                    )
                ],
                noncurrent_version_transitions=[
                    aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionTransitionArgs(
                        noncurrent_days=args.glacier_after_days, storage_class="GLACIER"
                    )
                ],
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=args.noncurrent_expire_days
                ),
            )
            for prefix in args.archive_prefixes
        ]
        # The Batch API's and the queue's deleted data, its bodies' retention, incomplete uploads (issue 61).
        rules.extend(retention_rules())
        return rules
