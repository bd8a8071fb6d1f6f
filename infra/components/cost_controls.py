"""Cost controls of one stack: a monthly budget, anomaly detection and the daily cost-report Lambda with its
schedule. Everything alerts the stack's (KMS-encrypted) alerts topic.

All three see this stack's spend only: they filter on the Stack tag, whose value is the stack's own name
(`naming.stack_tag_value`), never on CostCenter, which several stacks share. Cost Explorer and Budgets see a
tag only once it is activated as a cost-allocation tag, which the payer account does (docs/cost.md); this
component activates it only when `cost.activate_cost_allocation_tags` says so, and warns while it does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming, versions
from infra.aws_context import AwsContext
from infra.components.iam import function_identity, policy_document, service_role
from infra.config import StackConfig

SCOPE_TAG_KEY = naming.STACK_TAG_KEY
# Activated together when configured: the scope tag the filters need, and CostCenter for chargeback reports.
ACTIVATED_TAG_KEYS = (SCOPE_TAG_KEY, "CostCenter")
REPORT_SOURCE = Path(__file__).resolve().parents[2] / "monitoring" / "cost_report" / "handler.py"
# Shipped beside the handler: the Batch API's usage per key (issue 63), which the handler imports as `usage`.
USAGE_SOURCE = REPORT_SOURCE.with_name("usage.py")
# What the report reads of the Batch API's objects in the stack's bucket (monitoring/cost_report/usage.py).
USAGE_READS = ("batch-api/records/batch/*", "batch-api/batches/*/execution.json", "batch-api/executions/*")
USAGE_LISTS = "batch-api/records/batch_done/*"
# 07:00 UTC: Cost Explorer has most of the previous UTC day by then, and the team reads it in the morning.
REPORT_SCHEDULE = "cron(0 7 * * ? *)"
# Cost Explorer's read actions have no resource-level permissions: "*" is the only resource AWS accepts.
CE_WILDCARD_REASON = "ce:GetCostAndUsage supports no resource-level permissions (AWS service authorization reference)"


@dataclass(frozen=True)
class CostControlsArgs:
    stack: str
    context: AwsContext
    monthly_budget_usd: float
    daily_report_threshold_usd: float
    topic_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_retention_days: int = 30
    activate_cost_allocation_tags: bool = False
    # With the Batch API (batch_api.enabled): the stack's bucket, whose batches the report adds up per key.
    batch_api_bucket: pulumi.Input[str] | None = None

    @property
    def nightly_machine_name(self) -> str:
        return naming.child(self.stack, "nightly")  # infra/components/nightly.py names it so

    @property
    def scope_tag_value(self) -> str:
        return naming.stack_tag_value(self.stack)

    @classmethod
    def from_config(
        cls,
        stack: str,
        config: StackConfig,
        context: AwsContext,
        topic_arn: pulumi.Input[str],
        key_arn: pulumi.Input[str],
        bucket_name: pulumi.Input[str] | None = None,
    ) -> CostControlsArgs:
        return cls(
            stack=stack,
            context=context,
            monthly_budget_usd=config.cost.monthly_budget_usd,
            daily_report_threshold_usd=config.cost.daily_report_threshold_usd,
            topic_arn=topic_arn,
            key_arn=key_arn,
            log_retention_days=config.monitoring.log_retention_days,
            activate_cost_allocation_tags=config.cost.activate_cost_allocation_tags,
            batch_api_bucket=bucket_name if config.batch_api.enabled else None,
        )


def budget_filter(stack_tag_value: str) -> list[dict[str, Any]]:
    """Budgets' tag filter syntax: `user:<key>$<value>` under TagKeyValue."""
    return [{"name": "TagKeyValue", "values": [f"user:{SCOPE_TAG_KEY}${stack_tag_value}"]}]


def anomaly_specification(stack_tag_value: str) -> dict[str, Any]:
    """A CUSTOM monitor over the stack's tag: an account may hold only one service-wide monitor."""
    return {"Tags": {"Key": SCOPE_TAG_KEY, "Values": [stack_tag_value], "MatchOptions": ["EQUALS"]}}


def activation_warning(stack: str, activated: bool) -> str | None:
    """What the plan says while this stack leaves the scope tag's activation to someone else."""
    if activated:
        return None
    return (
        f"cost controls: the budget, anomaly monitor and daily cost report of stack '{stack}' filter on the "
        f"cost-allocation tag {SCOPE_TAG_KEY}={naming.stack_tag_value(stack)} and see no spend until "
        f"'{SCOPE_TAG_KEY}' is activated in the payer account (Billing > Cost allocation tags; about a day after "
        "resources first carry it). Set llm-batch:cost.activate_cost_allocation_tags to true to do it from this "
        "stack in a standalone account; see docs/cost.md."
    )


def usage_statements(context: AwsContext, bucket: str, key_arn: str, machine_name: str) -> list[dict[str, Any]]:
    """With the Batch API: list the done markers, read the batches and their runs' execution markers (through S3
    with the stack key), and describe the nightly machine's executions; nothing else of the bucket."""
    bucket_arn = f"arn:{context.partition}:s3:::{bucket}"
    executions = f"arn:{context.partition}:states:{context.region}:{context.account_id}:execution:{machine_name}:*"
    return [
        {
            "Sid": "ListClosedBatches",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [USAGE_LISTS]}},
        },
        {
            "Sid": "ReadBatchUsage",
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": [f"{bucket_arn}/{key}" for key in USAGE_READS],
        },
        {
            "Sid": "DecryptBatchRecords",
            "Effect": "Allow",
            "Action": "kms:Decrypt",
            "Resource": key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": f"s3.{context.region}.{context.dns_suffix}"}},
        },
        {"Sid": "DescribeExecutions", "Effect": "Allow", "Action": "states:DescribeExecution", "Resource": executions},
    ]


def report_policy(
    context: AwsContext,
    topic_arn: str,
    key_arn: str,
    log_group_arn: str,
    usage: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Least privilege for the report: read costs, publish to this topic only, write its own log group; with the
    Batch API, read what `usage_statements` names."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            # Cost Explorer has no resource-level permissions (see infra/rules/iam_allowlist.py).
            {"Sid": "ReadCosts", "Effect": "Allow", "Action": "ce:GetCostAndUsage", "Resource": "*"},
            {"Sid": "PublishReport", "Effect": "Allow", "Action": "sns:Publish", "Resource": topic_arn},
            {
                # The topic is KMS-encrypted: publishing makes a data key, and only through SNS.
                "Sid": "EncryptForTopic",
                "Effect": "Allow",
                "Action": ["kms:GenerateDataKey*", "kms:Decrypt"],
                "Resource": key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": f"sns.{context.region}.{context.dns_suffix}"}},
            },
            {
                "Sid": "WriteOwnLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": f"{log_group_arn}:*",
            },
            *(usage or []),
        ],
    }


class CostControls(pulumi.ComponentResource):
    """`function_name`, `budget_name`: what operators look up; every alert goes to `args.topic_arn`."""

    function_name: pulumi.Output[str]
    budget_name: pulumi.Output[str]

    def __init__(self, name: str, args: CostControlsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        # The choice is recorded on the component so the plan's checks can hold the resources to it.
        super().__init__(
            "llmbatch:cost_controls:CostControls",
            name,
            {
                "activateCostAllocationTags": args.activate_cost_allocation_tags,
                "scopeTag": {SCOPE_TAG_KEY: args.scope_tag_value},
            },
            opts,
        )
        child = pulumi.ResourceOptions(parent=self)

        if args.activate_cost_allocation_tags:
            for tag_key in ACTIVATED_TAG_KEYS:
                # Account-wide: keep it active when one of several stacks is destroyed.
                aws.costexplorer.CostAllocationTag(
                    f"{name}-tag-{tag_key.lower()}",
                    tag_key=tag_key,
                    status="Active",
                    opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
                )
        elif (warning := activation_warning(args.stack, activated=False)) is not None:
            pulumi.log.warn(warning)
        budget = self._budget(name, args, child)
        self._anomaly_detection(name, args, child)
        function = self._report(name, args, child)

        self.function_name = function.name
        self.budget_name = budget.name
        self.register_outputs({"function_name": self.function_name, "budget_name": self.budget_name})

    def _budget(self, name: str, args: CostControlsArgs, child: pulumi.ResourceOptions) -> aws.budgets.Budget:
        def notification(threshold: float, kind: str) -> aws.budgets.BudgetNotificationArgs:
            return aws.budgets.BudgetNotificationArgs(
                comparison_operator="GREATER_THAN",
                notification_type=kind,
                threshold=threshold,
                threshold_type="PERCENTAGE",
                subscriber_sns_topic_arns=[args.topic_arn],
            )

        return aws.budgets.Budget(
            f"{name}-budget",
            name=naming.child(args.stack, "monthly"),
            budget_type="COST",
            time_unit="MONTHLY",
            limit_amount=f"{args.monthly_budget_usd:.2f}",
            limit_unit="USD",
            cost_filters=[aws.budgets.BudgetCostFilterArgs(**item) for item in budget_filter(args.scope_tag_value)],
            notifications=[notification(80, "ACTUAL"), notification(100, "FORECASTED")],
            opts=child,
        )

    def _anomaly_detection(self, name: str, args: CostControlsArgs, child: pulumi.ResourceOptions) -> None:
        monitor = aws.costexplorer.AnomalyMonitor(
            f"{name}-anomaly-monitor",
            name=naming.child(args.stack, "spend"),
            monitor_type="CUSTOM",
            monitor_specification=json.dumps(anomaly_specification(args.scope_tag_value)),
            opts=child,
        )
        aws.costexplorer.AnomalySubscription(
            f"{name}-anomaly-subscription",
            name=naming.child(args.stack, "anomalies"),
            # SNS subscribers only take IMMEDIATE alerts.
            frequency="IMMEDIATE",
            monitor_arn_lists=[monitor.arn],
            subscribers=[aws.costexplorer.AnomalySubscriptionSubscriberArgs(type="SNS", address=args.topic_arn)],
            # An anomaly worth a day's threshold is worth a message; smaller ones are noise.
            threshold_expression=aws.costexplorer.AnomalySubscriptionThresholdExpressionArgs(
                dimension=aws.costexplorer.AnomalySubscriptionThresholdExpressionDimensionArgs(
                    key="ANOMALY_TOTAL_IMPACT_ABSOLUTE",
                    match_options=["GREATER_THAN_OR_EQUAL"],
                    values=[f"{args.daily_report_threshold_usd:g}"],
                )
            ),
            opts=child,
        )

    def _report(self, name: str, args: CostControlsArgs, child: pulumi.ResourceOptions) -> aws.lambda_.Function:
        function_name = naming.child(args.stack, "cost-report")
        identity = function_identity(
            f"{name}-report",
            stack=args.stack,
            function="cost-report",
            lambda_service="lambda.amazonaws.com",
            account_id=args.context.account_id,
            key_arn=args.key_arn,
            log_retention_days=args.log_retention_days,
            policy=lambda log_arn: pulumi.Output.all(
                args.topic_arn, args.key_arn, log_arn, args.batch_api_bucket
            ).apply(
                lambda values: json.dumps(
                    report_policy(
                        args.context,
                        values[0],
                        values[1],
                        values[2],
                        None
                        if values[3] is None
                        else usage_statements(args.context, values[3], values[1], args.nightly_machine_name),
                    )
                )
            ),
            opts=child,
        )
        function = aws.lambda_.Function(
            f"{name}-report",
            name=function_name,
            description="Yesterday's cost of this stack by service; alerts the topic above the threshold",
            runtime=versions.LAMBDA_PYTHON_RUNTIME,
            architectures=["arm64"],
            handler="handler.handler",
            # The handler and its usage module ship: they import boto3 (in the runtime) and the standard library.
            code=pulumi.AssetArchive(
                {"handler.py": pulumi.FileAsset(str(REPORT_SOURCE)), "usage.py": pulumi.FileAsset(str(USAGE_SOURCE))}
            ),
            role=identity.role.arn,
            timeout=60,
            memory_size=256,
            environment=aws.lambda_.FunctionEnvironmentArgs(
                variables={
                    "COST_TAG_KEY": SCOPE_TAG_KEY,
                    "COST_TAG_VALUE": args.scope_tag_value,
                    "ALERT_TOPIC_ARN": args.topic_arn,
                    "THRESHOLD_USD": f"{args.daily_report_threshold_usd:g}",
                    **(
                        {}
                        if args.batch_api_bucket is None
                        else {
                            "BATCH_API_BUCKET": args.batch_api_bucket,
                            "STATE_MACHINE_ARN": (
                                f"arn:{args.context.partition}:states:{args.context.region}:"
                                f"{args.context.account_id}:stateMachine:{args.nightly_machine_name}"
                            ),
                        }
                    ),
                }
            ),
            logging_config=aws.lambda_.FunctionLoggingConfigArgs(log_format="JSON", log_group=identity.log_group.name),
            opts=child,
        )
        # A report that fails (Cost Explorer or SNS down, a bad setting) must not fail silently.
        aws.cloudwatch.MetricAlarm(
            f"{name}-report-errors",
            name=naming.child(args.stack, "cost-report-errors"),
            alarm_description="The daily cost report failed; see its log group",
            namespace="AWS/Lambda",
            metric_name="Errors",
            dimensions={"FunctionName": function.name},
            statistic="Sum",
            period=86400,
            evaluation_periods=1,
            threshold=1,
            comparison_operator="GreaterThanOrEqualToThreshold",
            treat_missing_data="notBreaching",
            alarm_actions=[args.topic_arn],
            opts=child,
        )
        self._schedule(name, args, function, child)
        return function

    def _schedule(
        self, name: str, args: CostControlsArgs, function: aws.lambda_.Function, child: pulumi.ResourceOptions
    ) -> None:
        scheduler_role = service_role(
            f"{name}-report-scheduler",
            role_name=naming.child(args.stack, "cost-report-scheduler"),
            service="scheduler.amazonaws.com",
            account_id=args.context.account_id,
            policy=function.arn.apply(
                lambda arn: policy_document([{"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": arn}])
            ),
            opts=child,
        )
        aws.scheduler.Schedule(
            f"{name}-report-schedule",
            name=naming.child(args.stack, "cost-report"),
            description="Daily cost report of yesterday (UTC)",
            schedule_expression=REPORT_SCHEDULE,
            schedule_expression_timezone="UTC",
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            target=aws.scheduler.ScheduleTargetArgs(
                arn=function.arn,
                role_arn=scheduler_role.arn,
                retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                    maximum_retry_attempts=2, maximum_event_age_in_seconds=3600
                ),
            ),
            opts=child,
        )
