"""Every stack's plan holds its cost controls, wired to the stack's own alerts topic and config."""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

from infra import versions
from infra.components.cost_controls import (
    REPORT_SOURCE,
    USAGE_SOURCE,
    anomaly_specification,
    report_policy,
    usage_statements,
)
from infra.config import load_stack_config
from infra.ops.stacks import read_stack_config
from tests.infra.conftest import STACKS
from tests.infra.plan_select import component, only_child, stack_key

Plan = list[dict[str, Any]]


def _config(stack: str) -> Any:
    from infra.config import decode_pulumi_values

    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def _one(plan: Plan, typ: str) -> dict[str, Any]:
    """The one `typ` of the program's CostControls component (other components make log groups, alarms...)."""
    return only_child(plan, component(plan, "llmbatch:cost_controls:CostControls", "cost"), typ)


def _topic_arn(plan: Plan) -> str:
    # The stack's alerts topic; stacks outside us-east-1 also have a billing-alarm topic there.
    topics = [i for i in plan if i["type"] == "aws:sns/topic:Topic" and i["name"] == "alerts-topic"]
    assert len(topics) == 1, f"expected one alerts topic, found {len(topics)}"
    return str(topics[0]["outputs"]["arn"])


@pytest.mark.parametrize("stack", STACKS)
def test_budget_filters_the_stack_tag_and_warns_the_topic_at_80_actual_and_100_forecast(
    plan_for: Callable[[str], Plan], stack: str
) -> None:
    plan, config = plan_for(stack), _config(stack)
    budget = _one(plan, "aws:budgets/budget:Budget")["inputs"]
    assert budget["budgetType"] == "COST" and budget["timeUnit"] == "MONTHLY"
    assert float(budget["limitAmount"]) == config.cost.monthly_budget_usd
    assert budget["costFilters"] == [{"name": "TagKeyValue", "values": [f"user:Stack$llm-batch-{stack}"]}]
    notifications = {(n["notificationType"], n["threshold"]) for n in budget["notifications"]}
    assert notifications == {("ACTUAL", 80), ("FORECASTED", 100)}
    for notification in budget["notifications"]:
        assert notification["thresholdType"] == "PERCENTAGE"
        assert notification["subscriberSnsTopicArns"] == [_topic_arn(plan)]


@pytest.mark.parametrize("stack", STACKS)
def test_no_stack_activates_cost_allocation_tags_by_default(plan_for: Callable[[str], Plan], stack: str) -> None:
    """Activation fails on a first deploy and in a member account: it is opt-in, and off in every stack file."""
    plan = plan_for(stack)
    assert not [item for item in plan if item["type"] == "aws:costexplorer/costAllocationTag:CostAllocationTag"]
    controls = component(plan, "llmbatch:cost_controls:CostControls", "cost")
    assert controls["inputs"]["activateCostAllocationTags"] is False
    assert controls["inputs"]["scopeTag"] == {"Stack": f"llm-batch-{stack}"}


@pytest.mark.parametrize("stack", STACKS)
def test_custom_anomaly_monitor_on_the_stack_tag_with_a_subscription_to_the_topic(
    plan_for: Callable[[str], Plan], stack: str
) -> None:
    plan = plan_for(stack)
    monitor = _one(plan, "aws:costexplorer/anomalyMonitor:AnomalyMonitor")
    assert monitor["inputs"]["monitorType"] == "CUSTOM"
    assert json.loads(monitor["inputs"]["monitorSpecification"]) == anomaly_specification(f"llm-batch-{stack}")
    subscription = _one(plan, "aws:costexplorer/anomalySubscription:AnomalySubscription")["inputs"]
    assert subscription["monitorArnLists"] == [monitor["outputs"]["arn"]]
    assert subscription["subscribers"] == [{"type": "SNS", "address": _topic_arn(plan)}]
    assert subscription["frequency"] == "IMMEDIATE"


@pytest.mark.parametrize("stack", STACKS)
def test_report_function_pinned_runtime_env_from_the_stack_and_least_privilege_role(
    plan_for: Callable[[str], Plan], stack: str
) -> None:
    plan, config = plan_for(stack), _config(stack)
    function = _one(plan, "aws:lambda/function:Function")
    inputs = function["inputs"]
    assert inputs["runtime"] == versions.LAMBDA_PYTHON_RUNTIME
    assert inputs["handler"] == "handler.handler"
    # The package is the handler and its usage module, from the repo's monitoring/cost_report.
    assert inputs["code"] == {
        "archive": {
            "handler.py": {"file": "monitoring/cost_report/handler.py"},
            "usage.py": {"file": "monitoring/cost_report/usage.py"},
        }
    }
    assert inputs["environment"]["variables"] == {
        "COST_TAG_KEY": "Stack",
        "COST_TAG_VALUE": f"llm-batch-{stack}",
        "ALERT_TOPIC_ARN": _topic_arn(plan),
        "THRESHOLD_USD": f"{config.cost.daily_report_threshold_usd:g}",
    }
    roles = {item["outputs"]["arn"]: item for item in plan if item["type"] == "aws:iam/role:Role"}
    role = roles[inputs["role"]]
    assert json.loads(role["inputs"]["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "lambda.amazonaws.com"
    }
    (policy,) = [
        item
        for item in plan
        if item["type"] == "aws:iam/rolePolicy:RolePolicy" and item["inputs"]["role"] == role["outputs"]["id"]
    ]
    statements = json.loads(policy["inputs"]["policy"])["Statement"]
    wildcard = [s for s in statements if s["Resource"] == "*"]
    # The only "*" is Cost Explorer's, which has no resource-level permissions.
    assert [s["Action"] for s in wildcard] == ["ce:GetCostAndUsage"]
    publish = [s for s in statements if s["Action"] == "sns:Publish"]
    assert publish == [
        {"Sid": "PublishReport", "Effect": "Allow", "Action": "sns:Publish", "Resource": _topic_arn(plan)}
    ]
    actions = [a for st in statements for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])]
    assert [a for a in actions if "*" in a] == ["kms:GenerateDataKey*"]
    # Its log group is the stack's, encrypted with the stack's key.
    (log_group,) = [
        item
        for item in plan
        if item["type"] == "aws:cloudwatch/logGroup:LogGroup"
        and item["inputs"]["name"] == inputs["loggingConfig"]["logGroup"]
    ]
    assert log_group["parent"] == function["parent"]
    assert log_group["inputs"]["kmsKeyId"] == stack_key(plan)["outputs"]["arn"]


@pytest.mark.parametrize("stack", STACKS)
def test_report_runs_daily_on_a_schedule_that_may_invoke_only_it(plan_for: Callable[[str], Plan], stack: str) -> None:
    plan = plan_for(stack)
    function_arn = _one(plan, "aws:lambda/function:Function")["outputs"]["arn"]
    schedule = _one(plan, "aws:scheduler/schedule:Schedule")["inputs"]
    assert schedule["scheduleExpression"].startswith("cron(") and schedule["scheduleExpression"].endswith("* * ? *)")
    assert schedule["scheduleExpressionTimezone"] == "UTC"
    assert schedule["target"]["arn"] == function_arn
    roles = {item["outputs"]["arn"]: item for item in plan if item["type"] == "aws:iam/role:Role"}
    scheduler_role = roles[schedule["target"]["roleArn"]]
    (policy,) = [
        item
        for item in plan
        if item["type"] == "aws:iam/rolePolicy:RolePolicy" and item["inputs"]["role"] == scheduler_role["outputs"]["id"]
    ]
    assert json.loads(policy["inputs"]["policy"])["Statement"] == [
        {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": function_arn}
    ]
    (alarm,) = [
        item["inputs"]
        for item in plan
        if item["type"] == "aws:cloudwatch/metricAlarm:MetricAlarm"
        and item["inputs"].get("dimensions")
        == {"FunctionName": _one(plan, "aws:lambda/function:Function")["outputs"]["name"]}
    ]
    assert (alarm["namespace"], alarm["metricName"]) == ("AWS/Lambda", "Errors")
    assert alarm["alarmActions"] == [_topic_arn(plan)]


def test_the_lambda_package_imports_only_boto3_and_the_standard_library() -> None:
    """Besides each other: the handler imports its usage module as `usage` in the package (and, in the repo only,
    as monitoring.cost_report.usage, behind `if __package__`)."""
    found = {}
    for source in (REPORT_SOURCE, USAGE_SOURCE):
        modules: set[str] = set()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
        found[source.name] = modules - set(sys.stdlib_module_names)
    assert found == {"handler.py": {"boto3", "botocore", "usage", "monitoring"}, "usage.py": set()}


def test_with_the_batch_api_the_report_reads_its_batches_and_the_machines_executions_only(
    front_plans: dict[str, Plan],
) -> None:
    plan = front_plans["small"]
    inputs = _one(plan, "aws:lambda/function:Function")["inputs"]
    (bucket,) = [i for i in plan if i["type"] == "aws:s3/bucket:Bucket" and i["name"] == "storage-bucket"]
    (machine,) = [i for i in plan if i["type"] == "aws:sfn/stateMachine:StateMachine" and i["name"] == "nightly-run"]
    variables = inputs["environment"]["variables"]
    assert variables["BATCH_API_BUCKET"] == bucket["outputs"]["bucket"]
    assert variables["STATE_MACHINE_ARN"] == machine["outputs"]["arn"]
    roles = {item["outputs"]["arn"]: item for item in plan if item["type"] == "aws:iam/role:Role"}
    (policy,) = [
        item
        for item in plan
        if item["type"] == "aws:iam/rolePolicy:RolePolicy"
        and item["inputs"]["role"] == roles[inputs["role"]]["outputs"]["id"]
    ]
    sids = [s["Sid"] for s in json.loads(policy["inputs"]["policy"])["Statement"]]
    assert sids[-4:] == ["ListClosedBatches", "ReadBatchUsage", "DecryptBatchRecords", "DescribeExecutions"]


def test_the_usage_statements_name_the_done_markers_the_records_and_the_nightly_executions() -> None:
    from infra.aws_context import AwsContext

    context = AwsContext(account_id="123456789012", partition="aws", region="eu-west-1", dns_suffix="amazonaws.com")
    listed, read, decrypt, describe = usage_statements(context, "b", "arn:k", "llm-batch-small-nightly")
    assert listed["Resource"] == "arn:aws:s3:::b"
    assert listed["Condition"] == {"StringLike": {"s3:prefix": ["batch-api/records/batch_done/*"]}}
    assert read["Resource"] == [
        "arn:aws:s3:::b/batch-api/records/batch/*",
        "arn:aws:s3:::b/batch-api/batches/*/execution.json",
        "arn:aws:s3:::b/batch-api/executions/*",
    ]
    assert decrypt["Condition"] == {"StringEquals": {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}}
    assert describe == {
        "Sid": "DescribeExecutions",
        "Effect": "Allow",
        "Action": "states:DescribeExecution",
        "Resource": "arn:aws:states:eu-west-1:123456789012:execution:llm-batch-small-nightly:*",
    }
    assert report_policy(context, "arn:t", "arn:k", "arn:lg", [describe])["Statement"][-1] == describe


def test_report_policy_scopes_kms_to_sns() -> None:
    from infra.aws_context import AwsContext

    context = AwsContext(account_id="123456789012", partition="aws", region="eu-west-1", dns_suffix="amazonaws.com")
    policy = report_policy(context, "arn:t", "arn:k", "arn:lg")
    (kms,) = [s for s in policy["Statement"] if s["Sid"] == "EncryptForTopic"]
    assert kms["Resource"] == "arn:k"
    assert kms["Condition"] == {"StringEquals": {"kms:ViaService": "sns.eu-west-1.amazonaws.com"}}
