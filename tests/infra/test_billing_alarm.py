"""The account-wide billing alarm: described as account-wide, and made by one stack per account when asked.

Built under the plan's mocks (infra.ops.plan.run_under_mocks) from the Observability component alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from infra.aws_context import AwsContext
from infra.config import MonitoringConfig, load_stack_config
from infra.ops.plan import run_under_mocks

CONTEXT = AwsContext(account_id="123456789012", partition="aws", region="us-east-1", dns_suffix="amazonaws.com")


def _alarms(account_billing_alarm: bool) -> list[dict[str, Any]]:
    def build() -> None:
        import pulumi_aws as aws

        from infra.components.observability import Observability, ObservabilityArgs

        billing = aws.Provider("billing", region="us-east-1")
        Observability(
            "observability",
            ObservabilityArgs(
                stack="small",
                context=CONTEXT,
                topic_arn="arn:aws:sns:us-east-1:123456789012:llm-batch-small-alerts",
                log_group_name="/llm-batch/small/job",
                monitoring=MonitoringConfig(),
                billing_limit_usd=400,
                alert_email=None,
                billing_provider=billing,
                account_billing_alarm=account_billing_alarm,
            ),
        )

    plan = run_under_mocks(build, stack="small")
    return [item for item in plan if item["type"] == "aws:cloudwatch/metricAlarm:MetricAlarm"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_billing_alarm_is_account_wide_and_optional(enabled: bool) -> None:
    billing = [item for item in _alarms(enabled) if item["inputs"].get("namespace") == "AWS/Billing"]
    if not enabled:
        assert billing == []
        return
    (alarm,) = billing
    assert alarm["inputs"]["name"] == "llm-batch-small-monthly-charges"
    # AWS/Billing has no per-stack figure: the alarm says plainly whose spend it watches.
    assert alarm["inputs"]["alarmDescription"].startswith("The whole AWS account's month-to-date estimated charges")
    assert "account-wide, not this stack alone" in alarm["inputs"]["alarmDescription"]


def test_every_stack_makes_it_unless_told_not_to() -> None:
    assert load_stack_config("small", {"cost_center": "cc"}).monitoring.account_billing_alarm is True
    config = load_stack_config("small", {"cost_center": "cc", "monitoring": {"account_billing_alarm": False}})
    assert config.monitoring.account_billing_alarm is False
