"""The Spot interruption rule against moto's EventBridge: the AWS sample event matches, others do not.

moto delivers matched events to SQS targets (not to SNS), so an SQS queue stands in for the alerts topic
as the place to see what the rule lets through.
"""

from __future__ import annotations

import json
import re

import boto3

from monitoring.events import (
    SPOT_INTERRUPTION_DETAIL_TYPE,
    SPOT_INTERRUPTION_INPUT_PATHS,
    SPOT_INTERRUPTION_INPUT_TEMPLATE,
    SPOT_INTERRUPTION_PATTERN,
)

# The shape of AWS's documented example event.
SPOT_WARNING_DETAIL = {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"}


def test_spot_warning_reaches_the_target_and_nothing_else(moto_reset: str) -> None:
    events = boto3.client("events", region_name="us-east-1")
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName="alerts-stand-in")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="spot-warning", EventPattern=json.dumps(SPOT_INTERRUPTION_PATTERN))
    events.put_targets(Rule="spot-warning", Targets=[{"Id": "alerts", "Arn": queue_arn}])

    events.put_events(
        Entries=[
            {"Source": "aws.ec2", "DetailType": "EC2 Instance Rebalance Recommendation",
             "Detail": json.dumps({"instance-id": "i-0"})},
            {"Source": "aws.ec2", "DetailType": "EC2 Instance State-change Notification",
             "Detail": json.dumps({"instance-id": "i-0", "state": "running"})},
            {"Source": "aws.ec2", "DetailType": SPOT_INTERRUPTION_DETAIL_TYPE,
             "Detail": json.dumps(SPOT_WARNING_DETAIL)},
        ]
    )  # fmt: skip
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert len(messages) == 1
    delivered = json.loads(messages[0]["Body"])
    assert delivered["detail-type"] == SPOT_INTERRUPTION_DETAIL_TYPE
    assert delivered["detail"]["instance-id"] == "i-1234567890abcdef0"


def test_input_template_uses_only_defined_paths() -> None:
    placeholders = set(re.findall(r"<([a-z-]+)>", SPOT_INTERRUPTION_INPUT_TEMPLATE))
    assert placeholders == set(SPOT_INTERRUPTION_INPUT_PATHS)
    for path in SPOT_INTERRUPTION_INPUT_PATHS.values():
        assert path.startswith("$.")
    assert json.loads(SPOT_INTERRUPTION_INPUT_TEMPLATE).startswith("Spot interruption warning")
