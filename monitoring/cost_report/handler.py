"""Daily cost report: yesterday's cost of one stack, by service, published to the stack's topic when high.

Runs as an AWS Lambda (handler ``handler.handler``) packaged from this folder alone, so it imports only boto3
and the standard library. Configuration comes from the environment the Pulumi program sets:

- ``COST_TAG_VALUE``: value of the tag that marks the stack's resources (the Cost Explorer filter); the
  Pulumi program sets the stack's own name under the ``Stack`` tag. ``COST_CENTER`` is read when it is unset.
- ``ALERT_TOPIC_ARN``: the stack's SNS topic; never written into code.
- ``THRESHOLD_USD``: publish only when yesterday's total is above this.
- ``COST_TAG_KEY`` (optional): the cost-allocation tag key, ``CostCenter`` by default.
- ``BATCH_API_BUCKET`` (optional, with the Batch API): the stack's bucket; the report then adds the day's usage
  and cost per key (``usage.py``, shipped beside this file) and sets the stack's metered total beside Cost
  Explorer's, with the difference and what it is made of (``reconcile``). ``STATE_MACHINE_ARN`` (optional): the
  nightly machine, whose executions' boot and hold the batches share.
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

if __package__:  # the repository: monitoring.cost_report
    from monitoring.cost_report import usage as batch_usage
else:  # the Lambda's package: handler.py and usage.py side by side at its root
    import usage as batch_usage  # type: ignore[no-redef]

LOG = logging.getLogger(__name__)
LOG.setLevel(logging.INFO)

DEFAULT_TAG_KEY = "CostCenter"
METRIC = "UnblendedCost"
# Cost Explorer pages are small; a runaway token loop must end with an error, not a Lambda timeout bill.
MAX_PAGES = 100
# The one service whose spend the batches' GPU time meters; every other is the stack's fixed lines or storage.
COMPUTE_SERVICE = "Amazon Elastic Compute Cloud - Compute"
UNTAGGED_NOTE = "untagged spend (resources without the tag): Cost Explorer's figure is filtered by the tag"
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
    batch_api_bucket: str | None = None
    state_machine_arn: str | None = None

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
            batch_api_bucket=env.get("BATCH_API_BUCKET") or None,
            state_machine_arn=env.get("STATE_MACHINE_ARN") or None,
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


def reconcile(cost: DailyCost, metered_usd: float) -> dict[str, Any]:
    """The stack's metered total (the day's batches, boot and hold included) beside Cost Explorer's, and the
    difference, made of: every service but EC2 compute (storage, the control plane, NAT, KMS, logs, Lambda: what
    no batch meters), and the EC2 compute the batches do not account for (nights, the Ray head and system nodes,
    NAT instances, the billed Spot price against the price table's). The parts sum to the difference."""
    difference = cost.total - metered_usd
    parts = {
        f"{COMPUTE_SERVICE} beyond the batches' GPU time": cost.by_service.get(COMPUTE_SERVICE, 0.0) - metered_usd,
        **{service: amount for service, amount in cost.by_service.items() if service != COMPUTE_SERVICE},
    }
    return {
        "metered_usd": round(metered_usd, 6),
        "cost_explorer_usd": round(cost.total, 6),
        "difference_usd": round(difference, 6),
        "difference_pct": round(difference / cost.total * 100, 2) if cost.total else None,
        "made_of": {name: round(amount, 6) for name, amount in sorted(parts.items(), key=lambda p: -abs(p[1]))},
        "not_in_either": UNTAGGED_NOTE,
    }


def usage_lines(usage: batch_usage.DayUsage, settings: ReportSettings, gap: dict[str, Any], unit: str) -> list[str]:
    """The report's part for the Batch API: each key's day, then the stack's total beside Cost Explorer's."""
    lines = [
        "",
        f"Batch API usage on {usage.day} (UTC), by key, boot and hold included: {usage.cost_usd:.2f} {unit} over "
        f"{len(usage.batches)} batch(es)",
        f"{'key':24} {'batches':>7} {'in tok':>12} {'out tok':>12} {'GPU h':>8} {'boot+hold':>9} {'cost':>10}",
    ]
    for row in usage.by_key():
        lines.append(
            f"{row.key:24} {row.batches:>7} {row.input_tokens:>12} {row.output_tokens:>12} {row.gpu_s / 3600:>8.3f} "
            f"{row.boot_hold_cost_usd:>9.2f} {row.cost_usd:>10.2f}"
        )
    pct = "n/a" if gap["difference_pct"] is None else f"{gap['difference_pct']:.1f}%"
    lines += [
        "",
        f"Stack total metered (the batches): {gap['metered_usd']:.2f} {unit}; Cost Explorer "
        f"({settings.tag_key}={settings.cost_center}): {gap['cost_explorer_usd']:.2f} {unit}; "
        f"difference {gap['difference_usd']:.2f} {unit} ({pct} of Cost Explorer's), made of:",
    ]
    lines += [f"{amount:>12.2f}  {name}" for name, amount in gap["made_of"].items()]
    lines += [f"Not in either: {gap['not_in_either']}.", f"Basis: {usage.basis}."]
    return lines


def format_message(
    cost: DailyCost, settings: ReportSettings, usage: batch_usage.DayUsage | None = None
) -> tuple[str, str]:
    """Subject and body for the alert: the total, then every service, most expensive first; with the Batch API,
    the day's usage by key and the stack's metered total beside Cost Explorer's."""
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
    if usage is not None:
        lines += usage_lines(usage, settings, reconcile(cost, usage.cost_usd), cost.unit)
    return subject, "\n".join(lines)


def run_report(
    ce: Any, sns: Any, settings: ReportSettings, day: date, usage: batch_usage.DayUsage | None = None
) -> dict[str, Any]:
    """`usage`: the day's Batch API usage (usage.DayUsage), or None for a stack without the Batch API."""
    cost = fetch_daily_cost(ce, day, settings)
    over = cost.total > settings.threshold_usd
    if over:
        subject, body = format_message(cost, settings, usage)
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
    if usage is not None:
        report["usage"] = {k: v for k, v in usage.as_json().items() if k != "batches"}
        report["reconcile"] = reconcile(cost, usage.cost_usd)
    # The log line carries figures only: no ARNs, no credentials.
    LOG.info("cost report %s", json.dumps({k: v for k, v in report.items() if k not in ("by_service", "usage")}))
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
    usage = None
    if settings.batch_api_bucket:
        sfn = boto3.client("stepfunctions") if settings.state_machine_arn else None
        reader = batch_usage.BucketReader(boto3.client("s3"), settings.batch_api_bucket, sfn)
        usage = batch_usage.read_day(reader, day)
    return run_report(ce, sns, settings, day, usage)
