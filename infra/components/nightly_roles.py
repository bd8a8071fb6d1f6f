"""What the nightly run's roles may do: the state machine (its run), the sweep, the schedules and the EKS
tiers' submit function. Plain functions of ARNs, so tests read them without Pulumi; infra/components/nightly.py
builds the roles from them.
"""

from __future__ import annotations

from typing import Any

from infra.aws_context import AwsContext
from infra.components.iam import via_services

#: Where the small tier's state machine writes the night's date, input and output for the instance.
RUN_REQUEST_KEY = "control/run.json"


def _static(prefix: str) -> str:
    """`output/{date}/` -> `output/`: the part IAM can pin."""
    return prefix.split("{", 1)[0]


def run_statements(
    *,
    bucket_arn: str,
    key_arn: str,
    topic_arn: str,
    input_prefix: str,
    output_prefix: str,
    group_arn: str | None,
    function_arn: str | None,
    batch_prefixes: tuple[str, str] | None = None,
    queue_arn: str | None = None,
) -> list[dict[str, Any]]:
    """What the nightly state machine does: look for the night's input, watch the output's markers, alert,
    and drive the capacity; with `batch_prefixes`, the same for a Batch API batch (its PlanBatch state)."""
    out = _static(output_prefix)
    statements: list[dict[str, Any]] = [
        {
            # A night with nothing under input/<date>/ is skipped before any GPU starts.
            "Sid": "FindNightInput",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [f"{_static(input_prefix)}*"]}},
        },
        {
            "Sid": "FindOutputMarkers",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [f"{out}*"]}},
        },
        {
            # Read the failure reason, clear a previous run's markers, consume an interruption's.
            "Sid": "ReadAndClearMarkers",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:DeleteObject"],
            "Resource": [f"{bucket_arn}/{out}*/_failed.json", f"{bucket_arn}/{out}*/_interrupted.json"],
        },
        {"Sid": "Alert", "Effect": "Allow", "Action": "sns:Publish", "Resource": topic_arn},
        {
            # The topic and the bucket are encrypted with the stack's key.
            "Sid": "UseStackKey",
            "Effect": "Allow",
            "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
            "Resource": key_arn,
            "Condition": via_services(key_arn, "s3", "sns"),
        },
    ]
    if batch_prefixes is not None:
        batch_in, batch_out = batch_prefixes
        statements += [
            {
                "Sid": "FindBatchInputAndMarkers",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{batch_in}*", f"{batch_out}*"]}},
            },
            {
                "Sid": "ReadAndClearBatchMarkers",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:DeleteObject"],
                "Resource": [f"{bucket_arn}/{batch_out}_failed.json", f"{bucket_arn}/{batch_out}_interrupted.json"],
            },
        ]
    if group_arn is not None:
        statements += [
            {
                "Sid": "WriteRunRequest",
                "Effect": "Allow",
                "Action": "s3:PutObject",
                "Resource": f"{bucket_arn}/{RUN_REQUEST_KEY}",
            },
            {
                "Sid": "ScaleGpuGroup",
                "Effect": "Allow",
                "Action": "autoscaling:SetDesiredCapacity",
                "Resource": group_arn,
            },
        ]
    if queue_arn is not None:
        # NextBatch: the tick function claims the next queued run for this execution.
        statements.append(
            {"Sid": "TakeNextRun", "Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": queue_arn}
        )
    if function_arn is not None:
        statements.append(
            {
                "Sid": "DriveRayJob",
                "Effect": "Allow",
                "Action": "lambda:InvokeFunction",
                "Resource": function_arn,
            }
        )
    return statements


def sweep_statements(
    *, nightly_arn: str, key_arn: str, topic_arn: str, group_arn: str | None, function_arn: str | None
) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = [
        {
            "Sid": "SeeRunningRuns",
            "Effect": "Allow",
            "Action": "states:ListExecutions",
            "Resource": nightly_arn,
        },
        {"Sid": "Alert", "Effect": "Allow", "Action": "sns:Publish", "Resource": topic_arn},
        {
            "Sid": "UseStackKey",
            "Effect": "Allow",
            "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
            "Resource": key_arn,
            "Condition": via_services(key_arn, "sns"),
        },
    ]
    if group_arn is not None:
        statements.append(
            {
                "Sid": "ScaleGpuGroupToZero",
                "Effect": "Allow",
                "Action": "autoscaling:SetDesiredCapacity",
                "Resource": group_arn,
            }
        )
    if function_arn is not None:
        statements.append(
            {
                "Sid": "ReleaseRayJob",
                "Effect": "Allow",
                "Action": "lambda:InvokeFunction",
                "Resource": function_arn,
            }
        )
    return statements


def scheduler_statements(machine_arns: list[str], queue_arn: str | None) -> list[dict[str, Any]]:
    """The schedules start the machines; with the Batch API the night's goes to the tick function instead."""
    statements: list[dict[str, Any]] = [
        {"Sid": "StartRuns", "Effect": "Allow", "Action": "states:StartExecution", "Resource": machine_arns}
    ]
    if queue_arn is not None:
        statements.append(
            {"Sid": "QueueTheNight", "Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": queue_arn}
        )
    return statements


def submitter_statements(
    *, context: AwsContext, log_group_arn: str, cluster_name: str, nodegroup_name: str | None
) -> list[dict[str, Any]]:
    """The VPC function: its logs, its network interfaces, and (medium) the GPU node group's size."""
    eni = context.arn("ec2", "network-interface/*")
    statements: list[dict[str, Any]] = [
        {
            "Sid": "Logs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": f"{log_group_arn}:*",
        },
        {
            "Sid": "VpcNetworkInterfaces",
            "Effect": "Allow",
            "Action": [
                "ec2:CreateNetworkInterface",
                "ec2:DeleteNetworkInterface",
                "ec2:AssignPrivateIpAddresses",
                "ec2:UnassignPrivateIpAddresses",
            ],
            "Resource": [eni, context.arn("ec2", "subnet/*"), context.arn("ec2", "security-group/*")],
        },
        {
            "Sid": "DescribeNetworkInterfaces",
            "Effect": "Allow",
            "Action": "ec2:DescribeNetworkInterfaces",
            "Resource": "*",
        },
    ]
    if nodegroup_name is not None:
        statements.append(
            {
                "Sid": "ScaleGpuNodeGroup",
                "Effect": "Allow",
                "Action": "eks:UpdateNodegroupConfig",
                "Resource": context.arn("eks", f"nodegroup/{cluster_name}/{nodegroup_name}/*"),
            }
        )
    return statements
