"""What operators watch: the job's alarms, dashboard, saved queries and the Spot warning rule; with the endpoint
or the Batch API on, theirs too (the Batch API's queue: monitoring.alarms.batch_api_alarms, its two graphs).

The definitions live in `monitoring/` (alarms, dashboard, queries, event pattern) and name the metrics the job
publishes (`workload.contract.metric_names`); this component only turns them into resources. Every alarm notifies the
stack's alerts topic, except where AWS forbids it: the billing metric lives only in us-east-1 and an alarm
can notify only a topic in its own region, so a stack elsewhere gets a small encrypted alerts topic there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.alerts import Alerts, AlertsArgs
from infra.components.kms import EncryptionKey, EncryptionKeyArgs
from infra.components.providers import BILLING_REGION
from infra.config import MonitoringConfig, StackConfig
from monitoring import events
from monitoring.alarms import AlarmSpec, ServeWatch, batch_api_alarms, billing_alarm, job_alarms, serve_alarms
from monitoring.dashboard import dashboard_body
from monitoring.queries import load_queries


@dataclass(frozen=True)
class ObservabilityArgs:
    stack: str
    context: AwsContext
    topic_arn: pulumi.Input[str]
    log_group_name: pulumi.Input[str]  # the job's group (JobAccess makes it, with the job's write access)
    monitoring: MonitoringConfig
    billing_limit_usd: float
    alert_email: str | None
    billing_provider: aws.Provider  # us-east-1
    # The billing alarm watches the whole account: one stack per account makes it (monitoring.account_billing_alarm).
    account_billing_alarm: bool = True
    # The online endpoint's alarms and graphs (serve.enabled); None: no endpoint.
    serve: ServeWatch | None = None
    # The Batch API queue's alarms and graphs (batch_api.enabled).
    batch_api: bool = False

    @classmethod
    def from_config(
        cls,
        stack: str,
        config: StackConfig,
        context: AwsContext,
        topic_arn: pulumi.Input[str],
        log_group_name: pulumi.Input[str],
        billing_provider: aws.Provider,
    ) -> ObservabilityArgs:
        return cls(
            stack=stack,
            context=context,
            topic_arn=topic_arn,
            log_group_name=log_group_name,
            monitoring=config.monitoring,
            billing_limit_usd=config.monitoring.billing_alarm_usd or config.cost.monthly_budget_usd,
            alert_email=config.alert_email,
            billing_provider=billing_provider,
            account_billing_alarm=config.monitoring.account_billing_alarm,
            serve=config.serve.watch if config.serve.enabled else None,
            batch_api=config.batch_api.enabled,
        )


def _alarm_args(spec: AlarmSpec, name: str, topic_arn: pulumi.Input[str]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "name": name,
        "alarm_description": spec.description,
        "comparison_operator": spec.comparison,
        "threshold": spec.threshold,
        "evaluation_periods": spec.evaluation_periods,
        "datapoints_to_alarm": spec.evaluation_periods,
        "treat_missing_data": spec.treat_missing_data,
        "alarm_actions": [topic_arn],
        "ok_actions": [topic_arn],
    }
    if spec.metric is not None:
        args.update(
            namespace=spec.metric.namespace,
            metric_name=spec.metric.name,
            dimensions=spec.metric.dimensions,
            statistic=spec.metric.statistic,
            period=spec.metric.period_s,
        )
    else:
        queries = [
            aws.cloudwatch.MetricAlarmMetricQueryArgs(
                id=query_id,
                return_data=False,
                metric=aws.cloudwatch.MetricAlarmMetricQueryMetricArgs(
                    namespace=ref.namespace,
                    metric_name=ref.name,
                    dimensions=ref.dimensions,
                    stat=ref.statistic,
                    period=ref.period_s,
                ),
            )
            for query_id, ref in spec.inputs.items()
        ]
        queries.append(
            aws.cloudwatch.MetricAlarmMetricQueryArgs(
                id="e1", expression=spec.expression, label=spec.key, return_data=True
            )
        )
        args["metric_queries"] = queries
    return args


class Observability(pulumi.ComponentResource):
    """`dashboard_name`: the stack's dashboard."""

    dashboard_name: pulumi.Output[str]

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:observability:Observability", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        stack, monitoring = args.stack, args.monitoring

        queries = load_queries()
        for query in queries:
            aws.cloudwatch.QueryDefinition(
                f"{name}-query-{query.name.replace('_', '-')}",
                # A "/" files the query in a folder named after the stack in the console.
                name=f"{naming.prefix(stack)}/{query.name}",
                query_string=query.text,
                log_group_names=[args.log_group_name],
                opts=child,
            )

        alarms = [
            aws.cloudwatch.MetricAlarm(
                f"{name}-alarm-{spec.key}",
                **_alarm_args(spec, naming.child(stack, spec.key), args.topic_arn),
                opts=child,
            )
            for spec in [
                *job_alarms(stack, monitoring.metrics_namespace, monitoring),
                *(serve_alarms(stack, monitoring.metrics_namespace, args.serve) if args.serve else []),
                *(batch_api_alarms(stack, monitoring.metrics_namespace) if args.batch_api else []),
            ]
        ]
        if args.account_billing_alarm:
            alarms.append(self._billing_alarm(name, args))

        slow_batches = next(query for query in queries if query.name == "slow_batches")
        dashboard = aws.cloudwatch.Dashboard(
            f"{name}-dashboard",
            dashboard_name=naming.child(stack, "batch"),
            dashboard_body=pulumi.Output.all(*[alarm.arn for alarm in alarms]).apply(
                lambda arns: json.dumps(
                    dashboard_body(
                        stack,
                        monitoring.metrics_namespace,
                        args.context.region,
                        monitoring,
                        naming.job_log_group(stack),
                        slow_batches,
                        list(arns),
                        args.serve,
                        args.batch_api,
                    ),
                    sort_keys=True,
                )
            ),
            opts=child,
        )

        rule = aws.cloudwatch.EventRule(
            f"{name}-spot-interruption",
            name=naming.child(stack, "spot-interruption"),
            description="EC2 Spot interruption warnings (two minutes' notice) to the alerts topic",
            event_pattern=json.dumps(events.SPOT_INTERRUPTION_PATTERN),
            opts=child,
        )
        aws.cloudwatch.EventTarget(
            f"{name}-spot-interruption-alerts",
            rule=rule.name,
            arn=args.topic_arn,
            input_transformer=aws.cloudwatch.EventTargetInputTransformerArgs(
                input_paths=events.SPOT_INTERRUPTION_INPUT_PATHS,
                input_template=events.SPOT_INTERRUPTION_INPUT_TEMPLATE,
            ),
            opts=child,
        )

        self.dashboard_name = dashboard.dashboard_name
        self.register_outputs({"dashboard_name": self.dashboard_name})

    def _billing_alarm(self, name: str, args: ObservabilityArgs) -> aws.cloudwatch.MetricAlarm:
        billing_opts = pulumi.ResourceOptions(parent=self, provider=args.billing_provider)
        topic_arn: pulumi.Input[str] = args.topic_arn
        if args.context.region != BILLING_REGION:
            # Same key policy and topic policy as the stack's own topic, made in us-east-1.
            context = dataclasses.replace(args.context, region=BILLING_REGION)
            in_billing_region = pulumi.ResourceOptions(parent=self, providers=[args.billing_provider])
            key = EncryptionKey(
                f"{name}-billing-kms", EncryptionKeyArgs(stack=args.stack, context=context), in_billing_region
            )
            topic_arn = Alerts(
                f"{name}-billing-alerts",
                AlertsArgs(
                    stack=args.stack,
                    context=context,
                    key_arn=key.key_arn,
                    email=args.alert_email,
                    topic_suffix="billing-alerts",
                ),
                in_billing_region,
            ).topic_arn
        spec = billing_alarm(args.billing_limit_usd)
        return aws.cloudwatch.MetricAlarm(
            f"{name}-alarm-{spec.key}",
            **_alarm_args(spec, naming.child(args.stack, spec.key), topic_arn),
            opts=billing_opts,
        )
