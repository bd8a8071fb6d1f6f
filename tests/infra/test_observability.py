"""Every stack's plan holds the job's log group, alarms (thresholds from config), dashboard, saved queries and
Spot rule, and the alarms watch the metrics the job publishes under the names its config gives it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra import naming
from infra.components.providers import BILLING_REGION
from infra.config import StackConfig, decode_pulumi_values, load_stack_config
from infra.ops.stacks import read_stack_config
from monitoring import events
from monitoring.alarms import billing_alarm, job_alarms
from monitoring.queries import load_queries
from tests.infra.conftest import STACKS, Plan
from tests.infra.plan_select import children, component, only_child, stack_key
from workload.contract import metric_names as mn

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def _config(stack: str) -> StackConfig:
    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def _of_type(plan: Plan, typ: str) -> list[dict[str, Any]]:
    return [item for item in plan if item["type"] == typ]


def _one(plan: Plan, typ: str, **inputs: Any) -> dict[str, Any]:
    found = [item for item in _of_type(plan, typ) if all(item["inputs"].get(k) == v for k, v in inputs.items())]
    assert len(found) == 1, f"{len(found)} {typ} with {inputs}"
    return found[0]


def _alerts_topic_arn(plan: Plan, stack: str) -> str:
    return str(_one(plan, "aws:sns/topic:Topic", name=naming.child(stack, "alerts"))["outputs"]["arn"])


def _observability(plan: Plan) -> dict[str, Any]:
    """The program's Observability component; other components (cost controls, Karpenter) make alarms and
    event rules of their own, which these tests are not about."""
    return component(plan, "llmbatch:observability:Observability", "observability")


def _job_log_group(plan: Plan, stack: str) -> dict[str, Any]:
    # The cost report's Lambda has a log group of its own; the job's is found by its name.
    return _one(plan, LOG_GROUP, name=naming.job_log_group(stack))


@pytest.fixture(params=STACKS)
def stack_plan(request: pytest.FixtureRequest, plan_for: Callable[[str], Plan]) -> tuple[str, Plan]:
    return request.param, plan_for(request.param)


def test_job_alarms_carry_the_configured_thresholds(stack_plan: tuple[str, Plan]) -> None:
    stack, plan = stack_plan
    config = _config(stack)
    topic = _alerts_topic_arn(plan, stack)
    alarms = {item["inputs"]["name"]: item["inputs"] for item in children(plan, _observability(plan), ALARM)}
    specs = job_alarms(stack, config.monitoring.metrics_namespace, config.monitoring)
    keys = ("gpu-underused", "batch-latency", "error-ratio", "no-progress", "engine-preemptions")
    assert {naming.child(stack, key) for key in keys} == {naming.child(stack, spec.key) for spec in specs}
    for spec in specs:
        alarm = alarms[naming.child(stack, spec.key)]
        assert alarm["threshold"] == spec.threshold
        assert alarm["comparisonOperator"] == spec.comparison
        assert alarm["evaluationPeriods"] == spec.evaluation_periods == alarm["datapointsToAlarm"]
        assert alarm["treatMissingData"] == "notBreaching"
        assert alarm["alarmActions"] == [topic] and alarm["okActions"] == [topic]
        assert "What to do:" in alarm["alarmDescription"]
    by_key = {spec.key: alarms[naming.child(stack, spec.key)] for spec in specs}
    assert by_key["gpu-underused"]["threshold"] == config.monitoring.gpu_util_min_percent
    assert by_key["batch-latency"]["threshold"] == config.monitoring.batch_latency_p95_max_s
    assert by_key["error-ratio"]["threshold"] == config.monitoring.error_ratio_max
    assert by_key["no-progress"]["evaluationPeriods"] * 5 == config.monitoring.no_progress_minutes
    assert by_key["engine-preemptions"]["evaluationPeriods"] * 5 == config.monitoring.preemptions_minutes


def test_large_stack_overrides_reach_the_plan(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("large")
    latency = _one(plan, ALARM, name=naming.child("large", "batch-latency"))
    assert latency["inputs"]["threshold"] == 180  # stacks/Pulumi.large.yaml, not the default 120
    assert _job_log_group(plan, "large")["inputs"]["retentionInDays"] == 90


def _alarm_metrics(alarm: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    if "metricName" in alarm:
        return [(alarm["namespace"], alarm["metricName"], alarm["dimensions"])]
    return [
        (query["metric"]["namespace"], query["metric"]["metricName"], query["metric"]["dimensions"])
        for query in alarm["metricQueries"]
        if "metric" in query
    ]


def test_alarms_watch_what_the_stack_job_publishes(stack_plan: tuple[str, Plan]) -> None:
    """Names from the plan against the job's own config for this stack and its metric table."""
    stack, plan = stack_plan
    config = _config(stack)
    job_metrics = config.job_config("s3://bucket/input/", "s3://bucket/output/", stack=stack).metrics
    # The driver publishes ALL_METRICS; each engine actor its ENGINE_METRICS (workload/telemetry/engine_stats.py).
    published = {metric.name: metric for metric in (*mn.ALL_METRICS, *mn.ENGINE_METRICS)}
    # Every job alarm the Observability component makes; the billing alarm watches AWS/Billing by design.
    job_alarm_items = [
        item
        for item in children(plan, _observability(plan), ALARM)
        if item["inputs"]["name"] != naming.child(stack, "monthly-charges")
    ]
    specs = job_alarms(stack, config.monitoring.metrics_namespace, config.monitoring)
    assert sorted(item["inputs"]["name"] for item in job_alarm_items) == sorted(
        naming.child(stack, spec.key) for spec in specs
    )
    for item in job_alarm_items:
        alarm = item["inputs"]
        for namespace, name, dimensions in _alarm_metrics(alarm):
            assert namespace == job_metrics.namespace, alarm["name"]
            assert name in published, f"{alarm['name']} watches {name}, which the job never publishes"
            assert (mn.DIM_STACK,) in published[name].dimension_sets()
            assert dimensions == {mn.DIM_STACK: job_metrics.stack} == {mn.DIM_STACK: stack}, alarm["name"]


def test_billing_alarm_is_account_wide_in_us_east_1(stack_plan: tuple[str, Plan]) -> None:
    stack, plan = stack_plan
    config = _config(stack)
    alarm = _one(plan, ALARM, name=naming.child(stack, "monthly-charges"))
    billing_provider = next(item for item in plan if item["name"] == "providers-aws-billing")
    assert billing_provider["inputs"]["region"] == BILLING_REGION
    assert alarm["provider"] == billing_provider["urn"]
    spec = billing_alarm(config.monitoring.billing_alarm_usd or config.cost.monthly_budget_usd)
    assert spec.metric is not None
    inputs = alarm["inputs"]
    assert (inputs["namespace"], inputs["metricName"], inputs["dimensions"]) == (
        "AWS/Billing",
        "EstimatedCharges",
        {"Currency": "USD"},
    )
    assert inputs["threshold"] == spec.threshold and inputs["treatMissingData"] == "ignore"
    if config.region == BILLING_REGION:
        assert inputs["alarmActions"] == [_alerts_topic_arn(plan, stack)]
    else:
        # An alarm notifies only a topic in its own region: an encrypted us-east-1 topic, with the e-mail.
        topic = _one(plan, "aws:sns/topic:Topic", name=naming.child(stack, "billing-alerts"))
        assert topic["provider"] == billing_provider["urn"]
        assert inputs["alarmActions"] == [topic["outputs"]["arn"]]
        key = next(
            item for item in _of_type(plan, "aws:kms/key:Key") if item["parent"] == _billing_key_component(plan, topic)
        )
        assert topic["inputs"]["kmsMasterKeyId"] == key["outputs"]["arn"]
        subscription = _one(plan, "aws:sns/topicSubscription:TopicSubscription", topic=topic["outputs"]["arn"])
        assert subscription["inputs"]["endpoint"] == config.alert_email


def _billing_key_component(plan: Plan, topic: dict[str, Any]) -> str:
    """The urn of the billing EncryptionKey component beside the topic's Alerts component."""
    alerts = next(item for item in plan if item["urn"] == topic["parent"])
    sibling = next(
        item for item in plan if item["type"] == "llmbatch:kms:EncryptionKey" and item["parent"] == alerts["parent"]
    )
    return str(sibling["urn"])


def test_log_group_queries_and_dashboard(stack_plan: tuple[str, Plan]) -> None:
    stack, plan = stack_plan
    config = _config(stack)
    group = _job_log_group(plan, stack)["inputs"]
    job_metrics = config.job_config("s3://b/i/", "s3://b/o/", stack=stack).metrics
    assert group["name"] == naming.job_log_group(stack) == job_metrics.log_group
    assert group["retentionInDays"] == config.monitoring.log_retention_days
    # The stack's own key: the one in the foundation's `kms` component.
    assert group["kmsKeyId"] == stack_key(plan)["outputs"]["arn"]

    saved = {
        item["inputs"]["name"]: item["inputs"]
        for item in children(plan, _observability(plan), "aws:cloudwatch/queryDefinition:QueryDefinition")
    }
    assert set(saved) == {f"{naming.prefix(stack)}/{query.name}" for query in load_queries()}
    for query in load_queries():
        definition = saved[f"{naming.prefix(stack)}/{query.name}"]
        assert definition["queryString"] == query.text
        assert definition["logGroupNames"] == [naming.job_log_group(stack)]

    dashboard = only_child(plan, _observability(plan), "aws:cloudwatch/dashboard:Dashboard")["inputs"]
    assert dashboard["dashboardName"] == naming.child(stack, "batch")
    body = json.loads(dashboard["dashboardBody"])
    # The widget shows the Observability component's alarms (the job's four and the billing alarm).
    alarm_arns = sorted(item["outputs"]["arn"] for item in children(plan, _observability(plan), ALARM))
    widgets = {widget["properties"]["title"]: widget["properties"] for widget in body["widgets"]}
    assert widgets["Alarms"]["alarms"] == alarm_arns and len(alarm_arns) == 6
    assert widgets["GPU utilisation (%)"]["region"] == config.region
    for title in ("Throughput", "Batch latency (s)", "Errors", "GPU utilisation (%)"):
        for line in widgets[title]["metrics"]:
            if not isinstance(line[0], dict):
                assert line[:4][0] == config.monitoring.metrics_namespace and line[2:4] == [
                    mn.DIM_STACK,
                    stack,
                ]


def test_spot_interruption_warnings_go_to_the_topic(stack_plan: tuple[str, Plan]) -> None:
    stack, plan = stack_plan
    # Karpenter (large) has EventBridge rules of its own, to its interruption queue; this is the alerts one.
    rule = only_child(plan, _observability(plan), "aws:cloudwatch/eventRule:EventRule")["inputs"]
    assert rule["name"] == naming.child(stack, "spot-interruption")
    assert json.loads(rule["eventPattern"]) == events.SPOT_INTERRUPTION_PATTERN
    target = only_child(plan, _observability(plan), "aws:cloudwatch/eventTarget:EventTarget")["inputs"]
    assert target["rule"] == rule["name"] and target["arn"] == _alerts_topic_arn(plan, stack)
    assert target["inputTransformer"]["inputPaths"] == events.SPOT_INTERRUPTION_INPUT_PATHS
    # The topic lets EventBridge publish (and the key lets it encrypt), or the warning is dropped silently.
    policy = json.loads(
        _one(plan, "aws:sns/topicPolicy:TopicPolicy", arn=_alerts_topic_arn(plan, stack))["inputs"]["policy"]
    )
    publishers = [s for s in policy["Statement"] if s.get("Sid") == "ServicesPublishAlerts"]
    assert "events.amazonaws.com" in publishers[0]["Principal"]["Service"]
