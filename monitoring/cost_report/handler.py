"""Daily cost report: yesterday's cost of one stack, by service, published to the stack's topic when high.

Runs as an AWS Lambda (handler ``handler.handler``) packaged from this folder alone, so it imports only boto3
and the standard library. Configuration comes from the environment the Pulumi program sets:

- ``COST_TAG_VALUE``: value of the tag that marks the stack's resources (the Cost Explorer filter); the
  Pulumi program sets the stack's own name under the ``Stack`` tag. ``COST_CENTER`` is read when it is unset.
- ``ALERT_TOPIC_ARN``: the stack's SNS topic; never written into code.
- ``THRESHOLD_USD``: publish only when yesterday's total is above this.
- ``COST_TAG_KEY`` (optional): the cost-allocation tag key, ``CostCenter`` by default.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

LOG = logging.getLogger(__name__)
LOG.setLevel(logging.INFO)

DEFAULT_TAG_KEY = "CostCenter"
METRIC = "UnblendedCost"
# Cost Explorer pages are small; a runaway token loop must end with an error, not a Lambda timeout bill.
MAX_PAGES = 100
# SNS subjects must be under 100 ASCII characters.
_SUBJECT_LIMIT = 99


class CostReportError(RuntimeError):
    """The report could not be produced or delivered; the message names the step and the cause."""


@dataclass(frozen=True)
class ReportSettings:
    cost_center: str
    topic_arn: str
    threshold_usd: float
    tag_key: str = DEFAULT_TAG_KEY

    @property
    def topic_region(self) -> str:
        return self.topic_arn.split(":")[3]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ReportSettings:
        tag_value = env.get("COST_TAG_VALUE") or env.get("COST_CENTER") or ""
        missing = [key for key in ("ALERT_TOPIC_ARN", "THRESHOLD_USD") if not env.get(key)]
        if not tag_value:
            missing.insert(0, "COST_TAG_VALUE (or COST_CENTER)")
        if missing:
            raise CostReportError(f"environment variable(s) not set: {', '.join(missing)}")
        raw_threshold = env["THRESHOLD_USD"]
        try:
            threshold = float(raw_threshold)
        except ValueError:
            raise CostReportError(f"THRESHOLD_USD must be a number of dollars, got {raw_threshold!r}") from None
        if threshold < 0:
            raise CostReportError(f"THRESHOLD_USD must not be negative, got {threshold}")
        topic_arn = env["ALERT_TOPIC_ARN"]
        if len(topic_arn.split(":")) != 6 or not topic_arn.startswith("arn:") or ":sns:" not in topic_arn:
            raise CostReportError(f"ALERT_TOPIC_ARN is not an SNS topic ARN: {topic_arn!r}")
        return cls(
            cost_center=tag_value,
            topic_arn=topic_arn,
            threshold_usd=threshold,
            tag_key=env.get("COST_TAG_KEY") or DEFAULT_TAG_KEY,
        )


@dataclass
class DailyCost:
    day: date
    unit: str = "USD"
    by_service: dict[str, float] = field(default_factory=dict)
    estimated: bool = False
    pages: int = 0

    @property
    def total(self) -> float:
        return sum(self.by_service.values())


def yesterday_utc(now: datetime) -> date:
    """The UTC calendar day before ``now``: Cost Explorer days are UTC days whatever the Lambda's zone."""
    if now.tzinfo is None:
        raise CostReportError("now must be timezone-aware; a naive time would shift the day by the local offset")
    return (now.astimezone(UTC) - timedelta(days=1)).date()


def _query(day: date, settings: ReportSettings) -> dict[str, Any]:
    return {
        # End is exclusive: [day, day + 1) is exactly one UTC day.
        "TimePeriod": {"Start": day.isoformat(), "End": (day + timedelta(days=1)).isoformat()},
        "Granularity": "DAILY",
        "Metrics": [METRIC],
        "GroupBy": [{"Type": "DIMENSION", "Key": "SERVICE"}],
        "Filter": {"Tags": {"Key": settings.tag_key, "Values": [settings.cost_center], "MatchOptions": ["EQUALS"]}},
    }


def fetch_daily_cost(ce: Any, day: date, settings: ReportSettings) -> DailyCost:
    """Yesterday's cost by service, following NextPageToken until Cost Explorer has no more pages."""
    query = _query(day, settings)
    result = DailyCost(day=day)
    token: str | None = None
    while True:
        if result.pages >= MAX_PAGES:
            raise CostReportError(f"Cost Explorer returned more than {MAX_PAGES} pages for {day}; giving up")
        request = dict(query, NextPageToken=token) if token else query
        try:
            page = ce.get_cost_and_usage(**request)
        except (ClientError, BotoCoreError) as err:
            raise CostReportError(f"Cost Explorer GetCostAndUsage failed for {day}: {err}") from err
        result.pages += 1
        for period in page.get("ResultsByTime", []):
            result.estimated = result.estimated or bool(period.get("Estimated", False))
            for group in period.get("Groups", []):
                try:
                    service = group["Keys"][0]
                    metric = group["Metrics"][METRIC]
                    amount = float(metric["Amount"])
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise CostReportError(
                        f"Cost Explorer returned a group without a {METRIC} amount for {day}: {group!r}"
                    ) from err
                result.unit = metric.get("Unit", result.unit)
                # A service can span two pages; add, never overwrite.
                result.by_service[service] = result.by_service.get(service, 0.0) + amount
        token = page.get("NextPageToken") or None
        if token is None:
            return result


def format_message(cost: DailyCost, settings: ReportSettings) -> tuple[str, str]:
    """Subject and body for the alert: the total, then every service, most expensive first."""
    subject = (
        f"[{settings.cost_center}] cost {cost.day}: {cost.total:.2f} {cost.unit} "
        f"(threshold {settings.threshold_usd:.2f})"
    )[:_SUBJECT_LIMIT]
    lines = [
        f"Cost of {settings.tag_key}={settings.cost_center} on {cost.day} (UTC): {cost.total:.2f} {cost.unit}",
        f"Threshold: {settings.threshold_usd:.2f} {cost.unit}",
    ]
    if cost.estimated:
        lines.append("Cost Explorer marks these figures as estimated; they may still rise.")
    lines.append("")
    for service, amount in sorted(cost.by_service.items(), key=lambda item: item[1], reverse=True):
        lines.append(f"{amount:>12.2f}  {service}")
    return subject, "\n".join(lines)


def run_report(ce: Any, sns: Any, settings: ReportSettings, day: date) -> dict[str, Any]:
    cost = fetch_daily_cost(ce, day, settings)
    over = cost.total > settings.threshold_usd
    if over:
        subject, body = format_message(cost, settings)
        try:
            sns.publish(TopicArn=settings.topic_arn, Subject=subject, Message=body)
        except (ClientError, BotoCoreError) as err:
            raise CostReportError(f"SNS Publish to the stack's topic failed: {err}") from err
    report = {
        "date": cost.day.isoformat(),
        "cost_center": settings.cost_center,
        "unit": cost.unit,
        "total": round(cost.total, 6),
        "by_service": {svc: round(amount, 6) for svc, amount in sorted(cost.by_service.items())},
        "estimated": cost.estimated,
        "threshold": settings.threshold_usd,
        "published": over,
        "pages": cost.pages,
    }
    # The log line carries figures only: no ARNs, no credentials.
    LOG.info("cost report %s", json.dumps({k: v for k, v in report.items() if k != "by_service"}))
    return report


def _day_from_event(event: Mapping[str, Any] | None, now: datetime) -> date:
    # A manual invoke may name a day ({"date": "2026-11-28"}) to rerun a report; the schedule sends none.
    raw = (event or {}).get("date")
    if raw is None:
        return yesterday_utc(now)
    try:
        return date.fromisoformat(str(raw))
    except ValueError:
        raise CostReportError(f"event 'date' must be YYYY-MM-DD, got {raw!r}") from None


def handler(event: Mapping[str, Any] | None, context: Any) -> dict[str, Any]:
    """Lambda entry point: report yesterday's (UTC) cost; returns the breakdown."""
    settings = ReportSettings.from_env(os.environ)
    day = _day_from_event(event, datetime.now(UTC))
    # Cost Explorer is a global API served from us-east-1.
    ce = boto3.client("ce", region_name="us-east-1")
    sns = boto3.client("sns", region_name=settings.topic_region)
    return run_report(ce, sns, settings, day)
