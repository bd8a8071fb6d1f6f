"""The alerts SNS topic (KMS-encrypted) that alarms, budgets and the cost report publish to."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext

_PUBLISHERS = [
    "cloudwatch.amazonaws.com",
    "budgets.amazonaws.com",
    "events.amazonaws.com",
    "costalerts.amazonaws.com",
]


@dataclass(frozen=True)
class AlertsArgs:
    stack: str
    context: AwsContext
    key_arn: pulumi.Input[str]
    email: str | None
    topic_suffix: str = "alerts"  # the topic is `llm-batch-<stack>-<topic_suffix>`


def topic_policy(topic_arn: str, context: AwsContext) -> dict[str, Any]:
    """The account manages the topic; AWS services publish only on this account's behalf."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AccountManagesTopic",
                "Effect": "Allow",
                "Principal": {"AWS": context.root_principal},
                "Action": [
                    "sns:Publish",
                    "sns:Subscribe",
                    "sns:GetTopicAttributes",
                    "sns:SetTopicAttributes",
                    "sns:ListSubscriptionsByTopic",
                ],
                "Resource": topic_arn,
            },
            {
                "Sid": "ServicesPublishAlerts",
                "Effect": "Allow",
                "Principal": {"Service": _PUBLISHERS},
                "Action": "sns:Publish",
                "Resource": topic_arn,
                "Condition": {"StringEquals": {"aws:SourceAccount": context.account_id}},
            },
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sns:Publish",
                "Resource": topic_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


class Alerts(pulumi.ComponentResource):
    """`topic_arn`: where every alarm and report goes; an e-mail subscription when configured."""

    topic_arn: pulumi.Output[str]

    def __init__(self, name: str, args: AlertsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:alerts:Alerts", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        topic = aws.sns.Topic(
            f"{name}-topic",
            name=naming.child(args.stack, args.topic_suffix),
            kms_master_key_id=args.key_arn,
            opts=child,
        )
        aws.sns.TopicPolicy(
            f"{name}-topic-policy",
            arn=topic.arn,
            policy=topic.arn.apply(lambda arn: json.dumps(topic_policy(arn, args.context))),
            opts=child,
        )
        if args.email:
            # E-mail subscriptions stay pending until the recipient confirms; Pulumi cannot confirm them.
            aws.sns.TopicSubscription(
                f"{name}-email", topic=topic.arn, protocol="email", endpoint=args.email, opts=child
            )
        self.topic_arn = topic.arn
        self.register_outputs({"topic_arn": self.topic_arn})
