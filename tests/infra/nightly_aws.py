"""Helpers for the nightly-run tests: a moto account set up the way a stack leaves it.

Nothing here is a mock of the code under test: the state machines run inside a real moto server, which calls
S3, Auto Scaling, SNS and Step Functions over HTTP. The one stand-in is `FakeInstance`, which plays the GPU
instance's part (writing the job's markers) because no instance boots in moto.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlparse

import boto3

from infra import statemachines

REGION = "us-east-1"
ROLE_ARN = "arn:aws:iam::123456789012:role/llm-batch-test-nightly"


def set_execution(endpoint: str, enabled: bool) -> None:
    """Switch moto's Step Functions between storing definitions and running them.

    moto runs executions only when this is set before the state machine is created; it is process-wide
    state of the server, so tests switch it back off when they finish.
    """
    body = json.dumps({"stepfunctions": {"execute_state_machine": enabled}}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/config", data=body, method="POST"))


def set_lambda_docker(endpoint: str, enabled: bool) -> None:
    """Switch moto's Lambda between running functions in Docker (absent here) and its Docker-free backend, whose
    invoke the tests point at the real handler, run in-process against the same moto server."""
    body = json.dumps({"lambda": {"use_docker": enabled}}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/config", data=body, method="POST"))


def create_function(name: str, source: str) -> str:
    """A Lambda function in moto named `name` (its code the file `source`; moto never runs it); its ARN."""
    import io
    import zipfile

    role = boto3.client("iam").create_role(
        RoleName=f"{name}-role", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(source, "handler.py")
    created = boto3.client("lambda").create_function(
        FunctionName=name,
        Runtime="python3.12",
        Role=role,
        Handler="handler.handler",
        Code={"ZipFile": archive.getvalue()},
    )
    return str(created["FunctionArn"])


@contextmanager
def executing_state_machines(endpoint: str) -> Iterator[None]:
    import os

    # moto's executor calls other services at localhost:MOTO_PORT.
    saved = os.environ.get("MOTO_PORT")
    os.environ["MOTO_PORT"] = str(urlparse(endpoint).port)
    set_execution(endpoint, True)
    try:
        yield
    finally:
        set_execution(endpoint, False)
        if saved is None:
            os.environ.pop("MOTO_PORT", None)
        else:
            os.environ["MOTO_PORT"] = saved


@dataclass
class SmallStack:
    """What a small stack's plan creates that the nightly run touches."""

    bucket: str
    asg: str
    topic_arn: str
    queue_url: str
    state_machine_arn: str = ""

    def substitutions(self, **overrides: Any) -> dict[str, statemachines.Substitution]:
        values: dict[str, statemachines.Substitution] = {
            "Stack": "small",
            "DataBucket": self.bucket,
            "InputPrefix": statemachines.format_template("input/{date}/"),
            "OutputPrefix": statemachines.format_template("output/{date}/"),
            "RunRequestKey": "control/run.json",
            "AutoScalingGroup": self.asg,
            "AlertsTopic": self.topic_arn,
            "PollSeconds": 1,
            "MaxPolls": 30,
            "MaxAttempts": 3,
            "RunDeadlineMinutes": 1,
            "StateMachineTimeoutSeconds": 300,
        }
        values.update(overrides)
        return values

    def desired_capacity(self) -> int:
        groups = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg])
        return int(groups["AutoScalingGroups"][0]["DesiredCapacity"])

    def alerts(self) -> list[str]:
        """Messages the alerts topic delivered (through an SQS subscription)."""
        sqs = boto3.client("sqs")
        received = sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        return [json.loads(m["Body"])["Message"] for m in received.get("Messages", [])]


# The nights the tests run that have input (a night without any is skipped before a GPU starts).
NIGHTS_WITH_INPUT = ("2026-11-26", "2026-11-27", "2026-11-28", "2026-11-29")
NIGHT_WITHOUT_INPUT = "2026-11-30"
NIGHT_HALF_UPLOADED = "2026-11-25"  # parts there, but no _READY: the upload has not finished


def create_small_stack() -> SmallStack:
    """A bucket with input for NIGHTS_WITH_INPUT, a GPU Auto Scaling group at 0 and an alerts topic with a
    queue listening."""
    s3 = boto3.client("s3")
    bucket = "llm-batch-small-data"
    s3.create_bucket(Bucket=bucket)
    for night in (*NIGHTS_WITH_INPUT, NIGHT_HALF_UPLOADED):
        s3.put_object(Bucket=bucket, Key=f"input/{night}/part-00000.jsonl", Body=b'{"prompt": "hello"}\n')
    for night in NIGHTS_WITH_INPUT:  # the uploader's last write (docs/resume.md): the night's input is whole
        s3.put_object(Bucket=bucket, Key=f"input/{night}/_READY", Body=b"")
    ec2 = boto3.client("ec2")
    template = ec2.create_launch_template(
        LaunchTemplateName="llm-batch-small-gpu",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    asg = "llm-batch-small-gpu"
    boto3.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=asg,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        MinSize=0,
        MaxSize=1,
        DesiredCapacity=0,
        AvailabilityZones=[f"{REGION}a"],
    )
    sns = boto3.client("sns")
    topic = sns.create_topic(Name="llm-batch-small-alerts")["TopicArn"]
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName="alerts-inbox")["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]
    queue_arn = attributes["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    return SmallStack(bucket=bucket, asg=asg, topic_arn=topic, queue_url=queue_url)


def create_state_machine(name: str, definition: dict[str, Any]) -> str:
    sfn = boto3.client("stepfunctions")
    created = sfn.create_state_machine(name=name, definition=json.dumps(definition), roleArn=ROLE_ARN)
    return str(created["stateMachineArn"])


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def wait_for_end(execution_arn: str, timeout_s: float = 90.0) -> dict[str, Any]:
    sfn = boto3.client("stepfunctions")
    result: dict[str, Any] = {}

    def ended() -> bool:
        result.update(sfn.describe_execution(executionArn=execution_arn))
        return result["status"] != "RUNNING"

    wait_for(ended, timeout_s, f"execution {execution_arn} to end")
    return result


class FakeInstance(threading.Thread):
    """Stands in for the Spot GPU instance (no instance boots in moto): once the group is scaled to 1 and the
    run request is in S3, it writes what the job would under the requested output."""

    def __init__(self, stack: SmallStack, outcomes: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.outcomes = outcomes
        self.requests: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            s3 = boto3.client("s3")
            for file_name, document in self.outcomes:
                wait_for(lambda: self.stack.desired_capacity() == 1, what="the group to scale to 1")
                request = json.loads(s3.get_object(Bucket=self.stack.bucket, Key="control/run.json")["Body"].read())
                self.requests.append(request)
                key = urlparse(request["output_uri"]).path.strip("/") + "/" + file_name  # a batch's has no "/"
                s3.put_object(Bucket=self.stack.bucket, Key=key, Body=json.dumps(document).encode())
                if file_name == "_interrupted.json":
                    # The state machine consumes the marker before it retries.
                    wait_for(partial(_absent, s3, self.stack.bucket, key), what=f"{key} to be consumed")
        except BaseException as error:  # surfaced by the test through .error
            self.error = error


def _absent(s3: Any, bucket: str, key: str) -> bool:
    return int(s3.list_objects_v2(Bucket=bucket, Prefix=key)["KeyCount"]) == 0


def summary(rows: int = 100, wall_s: float = 1800.0) -> dict[str, Any]:
    """A summary.json with the keys the job writes."""
    return {
        "rows_in": rows,
        "rows_ok": rows - 1,
        "rows_failed": 1,
        "input_tokens": rows * 50,
        "output_tokens": rows * 64,
        "wall_s": wall_s,
        "output_tok_per_s": rows * 64 / wall_s,
        "started_at": "2026-11-28T01:00:00Z",
        "finished_at": "2026-11-28T01:30:00Z",
        "model": "Qwen/Qwen3-0.6B",
        "config_hash": "abc123",
        "attempts": 1,
    }
