"""The cost-report handler, run in-process against the moto server.

Cost Explorer answers come from moto's own canned-results API (`/moto-api/static/ce/cost-and-usage-results`);
published alerts are read back from an SQS queue subscribed to the topic, as a subscriber would see them.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import boto3
import pytest

from monitoring.cost_report import handler as cost_report

COST_CENTER = "llm-batch-small"


def _load_ce_results(endpoint: str, pages: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/static/ce/cost-and-usage-results",
        data=json.dumps({"results": pages}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request) as response:
        assert response.status == 201


def _page(day: date, groups: dict[str, float], token: str | None, estimated: bool = True) -> dict[str, Any]:
    page: dict[str, Any] = {
        "ResultsByTime": [
            {
                "TimePeriod": {"Start": day.isoformat(), "End": (day + timedelta(days=1)).isoformat()},
                "Total": {},
                "Groups": [
                    {
                        "Keys": [service],
                        "Metrics": {"UnblendedCost": {"Amount": f"{amount:.10f}", "Unit": "USD"}},
                    }
                    for service, amount in groups.items()
                ],
                "Estimated": estimated,
            }
        ],
        "DimensionValueAttributes": [],
        "GroupDefinitions": [{"Type": "DIMENSION", "Key": "SERVICE"}],
    }
    if token:
        page["NextPageToken"] = token
    return page


@pytest.fixture
def topic_and_queue(moto_reset: str) -> Iterator[tuple[str, str]]:
    sns = boto3.client("sns", region_name="us-east-1")
    sqs = boto3.client("sqs", region_name="us-east-1")
    topic_arn = sns.create_topic(Name="llm-batch-small-alerts")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="alerts-inbox")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    yield topic_arn, queue_url


def _received(queue_url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", region_name="us-east-1")
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    return [json.loads(message["Body"]) for message in messages]


def _env(monkeypatch: pytest.MonkeyPatch, topic_arn: str, threshold: str) -> None:
    monkeypatch.setenv("COST_CENTER", COST_CENTER)
    monkeypatch.setenv("ALERT_TOPIC_ARN", topic_arn)
    monkeypatch.setenv("THRESHOLD_USD", threshold)


def test_empty_day_reports_zero_and_publishes_nothing(
    topic_and_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic_arn, queue_url = topic_and_queue
    _env(monkeypatch, topic_arn, "0")

    report = cost_report.handler({}, None)

    assert report["total"] == 0
    assert report["by_service"] == {}
    assert report["published"] is False
    assert report["pages"] == 1
    assert report["date"] == (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    assert _received(queue_url) == []


def test_many_services_over_several_pages_are_summed_and_published(
    moto_reset: str, topic_and_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic_arn, queue_url = topic_and_queue
    day = date(2026, 11, 28)
    pages = [
        {"Amazon Elastic Compute Cloud - Compute": 41.25, "Amazon Simple Storage Service": 0.52},
        {
            "Amazon Elastic Kubernetes Service": 2.40,
            "Amazon Virtual Private Cloud": 1.08,
            "AWS Lambda": 0.0001,
        },
        # The last page repeats EC2: a service split across pages must be added, not overwritten.
        {"Amazon Elastic Compute Cloud - Compute": 3.75, "AmazonCloudWatch": 0.30},
    ]
    _load_ce_results(
        moto_reset,
        [_page(day, pages[0], "page-2"), _page(day, pages[1], "page-3"), _page(day, pages[2], None)],
    )
    _env(monkeypatch, topic_arn, "20")

    report = cost_report.handler({"date": day.isoformat()}, None)

    assert report["pages"] == 3
    assert report["by_service"] == {
        "AWS Lambda": 0.0001,
        "Amazon Elastic Compute Cloud - Compute": 45.0,
        "Amazon Elastic Kubernetes Service": 2.4,
        "Amazon Simple Storage Service": 0.52,
        "Amazon Virtual Private Cloud": 1.08,
        "AmazonCloudWatch": 0.3,
    }
    assert report["total"] == pytest.approx(49.3001)
    assert report["estimated"] is True
    assert report["published"] is True

    (alert,) = _received(queue_url)
    assert alert["Subject"] == f"[{COST_CENTER}] cost 2026-11-28: 49.30 USD (threshold 20.00)"
    body_lines = alert["Message"].splitlines()
    assert body_lines[0] == f"Cost of CostCenter={COST_CENTER} on 2026-11-28 (UTC): 49.30 USD"
    services_in_order = [line.strip().split("  ", 1)[1] for line in body_lines if line.startswith(" ")]
    assert services_in_order[0] == "Amazon Elastic Compute Cloud - Compute"
    assert services_in_order[-1] == "AWS Lambda"
    assert len(services_in_order) == 6


def test_under_threshold_returns_breakdown_without_publishing(
    moto_reset: str, topic_and_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic_arn, queue_url = topic_and_queue
    day = date(2026, 11, 27)
    _load_ce_results(moto_reset, [_page(day, {"Amazon Simple Storage Service": 0.4}, None, estimated=False)])
    _env(monkeypatch, topic_arn, "5")

    report = cost_report.handler({"date": day.isoformat()}, None)

    assert report["by_service"] == {"Amazon Simple Storage Service": 0.4}
    assert report["published"] is False
    assert report["estimated"] is False
    assert _received(queue_url) == []


def test_request_filters_on_the_cost_center_tag_for_one_utc_day() -> None:
    """The query itself (no server needed): one UTC day, grouped by service, filtered to the stack's tag."""
    settings = cost_report.ReportSettings(
        cost_center=COST_CENTER, topic_arn="arn:aws:sns:eu-west-1:123456789012:t", threshold_usd=1
    )
    query = cost_report._query(date(2026, 12, 31), settings)
    assert query["TimePeriod"] == {"Start": "2026-12-31", "End": "2027-01-01"}
    assert query["Filter"] == {"Tags": {"Key": "CostCenter", "Values": [COST_CENTER], "MatchOptions": ["EQUALS"]}}
    assert query["GroupBy"] == [{"Type": "DIMENSION", "Key": "SERVICE"}]
    assert settings.topic_region == "eu-west-1"


def test_yesterday_is_the_utc_day_whatever_the_local_zone() -> None:
    from datetime import timezone

    # 01:30 on Nov 29 in UTC+3 is 22:30 on Nov 28 in UTC: yesterday (UTC) is Nov 27.
    now = datetime(2026, 11, 29, 1, 30, tzinfo=timezone(timedelta(hours=3)))
    assert cost_report.yesterday_utc(now) == date(2026, 11, 27)
    with pytest.raises(cost_report.CostReportError, match="timezone-aware"):
        cost_report.yesterday_utc(datetime(2026, 11, 29))


def test_failing_cost_explorer_call_raises_a_clear_error_and_publishes_nothing(
    topic_and_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cost Explorer is pointed at a port where nothing listens: a real connection failure, not a mock."""
    import socket

    from botocore.config import Config

    topic_arn, queue_url = topic_and_queue
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    dead_ce = boto3.client(
        "ce",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{dead_port}",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    sns = boto3.client("sns", region_name="us-east-1")
    settings = cost_report.ReportSettings(cost_center=COST_CENTER, topic_arn=topic_arn, threshold_usd=0)

    with pytest.raises(cost_report.CostReportError, match="Cost Explorer GetCostAndUsage failed for 2026-11-28"):
        cost_report.run_report(dead_ce, sns, settings, date(2026, 11, 28))
    assert _received(queue_url) == []


def test_failing_publish_names_sns(
    moto_reset: str, topic_and_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic ARN names a topic that does not exist on the moto server: SNS answers NotFound."""
    day = date(2026, 11, 26)
    _load_ce_results(moto_reset, [_page(day, {"Amazon Elastic Compute Cloud - Compute": 9.0}, None)])
    _env(monkeypatch, "arn:aws:sns:us-east-1:123456789012:no-such-topic", "1")

    with pytest.raises(cost_report.CostReportError, match="SNS Publish to the stack's topic failed"):
        cost_report.handler({"date": day.isoformat()}, None)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, r"COST_TAG_VALUE \(or COST_CENTER\), ALERT_TOPIC_ARN, THRESHOLD_USD"),
        (
            {"COST_CENTER": "c", "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:1:t", "THRESHOLD_USD": "ten"},
            "number",
        ),
        (
            {"COST_CENTER": "c", "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:1:t", "THRESHOLD_USD": "-1"},
            "negative",
        ),
        ({"COST_CENTER": "c", "ALERT_TOPIC_ARN": "my-topic", "THRESHOLD_USD": "1"}, "not an SNS topic ARN"),
    ],
)
def test_bad_settings_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(cost_report.CostReportError, match=message):
        cost_report.ReportSettings.from_env(env)


def test_the_stack_tag_is_what_the_program_sets() -> None:
    """The program scopes the report by COST_TAG_KEY=Stack and COST_TAG_VALUE=<the stack's name>."""
    settings = cost_report.ReportSettings.from_env(
        {
            "COST_TAG_KEY": "Stack",
            "COST_TAG_VALUE": "llm-batch-small",
            "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:t",
            "THRESHOLD_USD": "1",
        }
    )
    assert (settings.tag_key, settings.cost_center) == ("Stack", "llm-batch-small")


def test_bad_event_date_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COST_CENTER", COST_CENTER)
    monkeypatch.setenv("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:123456789012:t")
    monkeypatch.setenv("THRESHOLD_USD", "1")
    with pytest.raises(cost_report.CostReportError, match="'date' must be YYYY-MM-DD"):
        cost_report.handler({"date": "yesterday"}, None)


def test_a_malformed_answer_is_named(moto_reset: str, topic_and_queue: tuple[str, str]) -> None:
    """moto returns whatever was loaded: a group without the UnblendedCost metric stands for a changed API."""
    topic_arn, queue_url = topic_and_queue
    day = date(2026, 11, 25)
    page = _page(day, {"AWS Lambda": 1.0}, None)
    page["ResultsByTime"][0]["Groups"][0]["Metrics"] = {"BlendedCost": {"Amount": "1", "Unit": "USD"}}
    _load_ce_results(moto_reset, [page])
    settings = cost_report.ReportSettings(cost_center=COST_CENTER, topic_arn=topic_arn, threshold_usd=0)
    ce = boto3.client("ce", region_name="us-east-1")
    sns = boto3.client("sns", region_name="us-east-1")
    with pytest.raises(cost_report.CostReportError, match="without a UnblendedCost amount for 2026-11-25"):
        cost_report.run_report(ce, sns, settings, day)
    assert _received(queue_url) == []
