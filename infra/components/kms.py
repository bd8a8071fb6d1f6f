"""The stack's customer-managed KMS key: S3, SNS, Secrets Manager and CloudWatch Logs all encrypt with it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext

# AWS's documented key-administrator actions: a key policy without an admin path can never be changed again.
_ADMIN_ACTIONS = [
    "kms:Create*",
    "kms:Describe*",
    "kms:Enable*",
    "kms:List*",
    "kms:Put*",
    "kms:Update*",
    "kms:Revoke*",
    "kms:Disable*",
    "kms:Get*",
    "kms:Delete*",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:ScheduleKeyDeletion",
    "kms:CancelKeyDeletion",
    "kms:RotateKeyOnDemand",
]
# Lets this account's IAM policies grant use of the key (the job's policy names the key's ARN).
_USE_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
# Services that publish to the encrypted alerts topic need to make data keys with it, on this account's behalf.
_PUBLISHER_SERVICES = [
    "cloudwatch.amazonaws.com",
    "budgets.amazonaws.com",
    "costalerts.amazonaws.com",
]
# EventBridge too (Spot interruption and rebalance notices, a failed night), but its delivery to an encrypted
# topic carries no aws:SourceAccount for the key policy to match (SNS developer guide, "Enable compatibility
# between event sources from AWS services and encrypted topics"; awslabs/landing-zone-accelerator-on-aws#407): under
# that condition every delivery fails (FailedInvocations). It gets its own statement without it; the topic
# policy still lets it publish only for this account (aws:SourceAccount there), and the key only encrypts.
EVENTBRIDGE = "events.amazonaws.com"
PUBLISHER_ACTIONS = ["kms:GenerateDataKey*", "kms:Decrypt"]


# What a service that launches instances needs to create their encrypted volumes with this key, from AWS's
# "Required AWS KMS key policy for use with encrypted volumes" (EC2 Auto Scaling user guide): use the key
# directly, and hand a grant to EC2/EBS for the volume (only ever for an AWS resource).
LAUNCHER_USE_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]


@dataclass(frozen=True)
class EncryptionKeyArgs:
    stack: str
    context: AwsContext
    # Roles that launch instances whose volumes this key encrypts (the Auto Scaling service-linked role):
    # IAM policies cannot be attached to a service-linked role, so only the key policy can let it in.
    launcher_role_arns: Sequence[str] = ()
    # The EKS tiers: the control-plane log group EKS names itself, outside the stack's prefix, also on this key.
    eks_cluster_logs: bool = False


def launcher_statements(role_arns: Sequence[str]) -> list[dict[str, Any]]:
    """Key-policy statements that let the launching roles encrypt the volumes they create."""
    if not role_arns:
        return []
    principal = {"AWS": sorted(role_arns)}
    return [
        {
            "Sid": "VolumeLaunchersUseKey",
            "Effect": "Allow",
            "Principal": principal,
            "Action": LAUNCHER_USE_ACTIONS,
            "Resource": "*",
        },
        {
            "Sid": "VolumeLaunchersGrantToAwsResources",
            "Effect": "Allow",
            "Principal": principal,
            "Action": "kms:CreateGrant",
            "Resource": "*",
            "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}},
        },
    ]


def key_policy(
    context: AwsContext, launcher_role_arns: Sequence[str] = (), stack: str = "", eks_cluster_logs: bool = False
) -> dict[str, Any]:
    """The key policy; in a key policy `Resource: "*"` means this key.

    CloudWatch Logs may use the key only for this stack's log groups (`/llm-batch/<stack>/...`), so another
    stack's (or anyone's) group in the account cannot be encrypted with, or read through, this key.
    """
    logs_principal = f"logs.{context.region}.{context.dns_suffix}"
    # The stack's own log groups, and on the EKS tiers the control plane's, whose name EKS fixes.
    own_groups = context.arn("logs", f"log-group:{naming.log_group_prefix(stack)}*")
    log_groups: str | list[str] = own_groups
    if eks_cluster_logs:
        log_groups = [own_groups, context.arn("logs", f"log-group:{naming.eks_cluster_log_group(stack)}")]
    return {
        "Version": "2012-10-17",
        "Statement": [
            *launcher_statements(launcher_role_arns),
            {
                "Sid": "KeyAdministration",
                "Effect": "Allow",
                "Principal": {"AWS": context.root_principal},
                "Action": _ADMIN_ACTIONS,
                "Resource": "*",
            },
            {
                "Sid": "KeyUseThroughIam",
                "Effect": "Allow",
                "Principal": {"AWS": context.root_principal},
                "Action": _USE_ACTIONS,
                "Resource": "*",
            },
            {
                "Sid": "AlertPublishers",
                "Effect": "Allow",
                "Principal": {"Service": _PUBLISHER_SERVICES},
                "Action": PUBLISHER_ACTIONS,
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:SourceAccount": context.account_id}},
            },
            {
                "Sid": "EventBridgeAlerts",
                "Effect": "Allow",
                "Principal": {"Service": EVENTBRIDGE},
                "Action": PUBLISHER_ACTIONS,
                "Resource": "*",
            },
            {
                "Sid": "CloudWatchLogs",
                "Effect": "Allow",
                "Principal": {"Service": logs_principal},
                "Action": [
                    "kms:Encrypt",
                    "kms:Decrypt",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:Describe*",
                ],
                "Resource": "*",
                "Condition": {"ArnLike": {"kms:EncryptionContext:aws:logs:arn": log_groups}},
            },
        ],
    }


class EncryptionKey(pulumi.ComponentResource):
    """A symmetric key with yearly rotation and an alias `alias/llm-batch-<stack>`."""

    key_arn: pulumi.Output[str]
    key_id: pulumi.Output[str]

    def __init__(self, name: str, args: EncryptionKeyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:kms:EncryptionKey", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        key = aws.kms.Key(
            f"{name}-key",
            description=f"{naming.prefix(args.stack)}: job data, alerts, secrets and logs",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=json.dumps(key_policy(args.context, args.launcher_role_arns, args.stack, args.eks_cluster_logs)),
            opts=child,
        )
        aws.kms.Alias(f"{name}-alias", name=f"alias/{naming.prefix(args.stack)}", target_key_id=key.key_id, opts=child)
        self.key_arn = key.arn
        self.key_id = key.key_id
        self.register_outputs({"key_arn": self.key_arn, "key_id": self.key_id})
