"""The Batch API front's lines in the estimate (infra/pricing/batch_api_cost.py, and its S3 requests,
infra/pricing/batch_api_requests.py) and the age of their prices."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from infra import facts
from infra.config import StackConfig, load_stack_config
from infra.pricing import batch_api_cost, batch_api_requests
from infra.pricing.batch_api_cost import front_items, load_front_prices
from infra.pricing.batch_api_requests import request_items
from infra.pricing.estimate import LineItem
from infra.pricing.idle_cost import load_idle_prices


def _config(**batch_api: object) -> StackConfig:
    return load_stack_config("small", {"cost_center": "cc", "batch_api": batch_api})


def test_no_front_no_lines() -> None:
    assert front_items(_config()) == []


def test_the_front_costs_its_ticks_and_its_assumed_requests() -> None:
    http, requests, compute, metrics = front_items(_config(enabled=True))
    ticks = 730 * 60 / 5  # every 5 minutes: 8,760 a month, called or not
    assert http.quantity == pytest.approx(0.02) and http.monthly_usd == pytest.approx(0.02)  # $1.00 a million
    assert requests.quantity == pytest.approx((ticks + 20_000) / 1e6)
    assert requests.monthly_usd == pytest.approx(requests.quantity * 0.2)
    assert compute.quantity == pytest.approx(ticks * 1.0 + 20_000 * 0.3)  # GB-seconds at 1 GB
    assert compute.monthly_usd == pytest.approx(compute.quantity * 0.0000133334)
    # $0.30 a metric, every hour published: queued, running, failed, expired and at risk (issue 62)
    assert (metrics.quantity, metrics.monthly_usd) == (5, pytest.approx(1.5))
    assert {line.group for line in (http, requests, compute, metrics)} == {"fixed"}
    (every_minute,) = [line for line in front_items(_config(enabled=True, tick_minutes=1)) if "ticks" in line.item]
    assert every_minute.quantity == pytest.approx((730 * 60 + 20_000) / 1e6)


def test_a_region_the_table_lacks_says_whose_price_it_shows() -> None:
    config = load_stack_config("small", {"cost_center": "cc", "region": "ap-south-1", "batch_api": {"enabled": True}})
    assert all(line.item.endswith("(us-east-1 price)") for line in front_items(config))


def test_the_price_table_is_fresh() -> None:
    table = load_front_prices()
    age = (datetime.now(UTC).date() - table.checked).days
    assert age <= facts.MAX_AGE_DAYS, f"{batch_api_cost.PRICES_FILE.name} checked {age} days ago: {table.how}"
    assert "api-gateway/pricing" in table.source and "lambda/pricing" in table.source


def _requests(config: StackConfig) -> dict[str, LineItem]:
    """The request lines by their name (the text before the first parenthesis)."""
    return {line.item.split(" (")[0]: line for line in request_items(config)}


def test_the_ticks_requests_follow_the_open_batches_not_the_finished_ones() -> None:
    """Every figure from the idle price table (S3 GET and LIST), the tick schedule and the stack's night."""
    config = _config(enabled=True)
    prices = load_idle_prices().regions["us-east-1"]
    get, lst = prices.s3_get_per_1000 / 1000, prices.s3_list_per_1000 / 1000
    ticks = 730 * 60 / config.batch_api.tick_minutes  # 8,760 at the default 5 minutes
    batches = batch_api_requests.BATCHES_PER_MONTH
    open_now = batches * config.cost.nightly_hours / 730
    # A month's batches' input and output files, and the nights kept as long, each listed and read three times.
    held = batches * (720 / 730) * 2 + (730 / 24) * (720 / 730) * 3
    lines = _requests(config)
    reads = lines["Batch API: the tick's S3 reads"]
    # The index and each open batch once (the tiers' metrics line reads nothing more), the held records once, and
    # the measured throughput in the share of ticks that find a batch open (issue 62's at-risk report).
    assert reads.quantity == pytest.approx(ticks * (1 + open_now + min(1.0, open_now) + held))
    assert reads.monthly_usd == pytest.approx(reads.quantity * get)
    listings = lines["Batch API: the tick's S3 listings"]
    assert (listings.quantity, listings.unit_price) == (pytest.approx(ticks * 8), pytest.approx(lst))
    pages = batch_api_requests.LIST_PAGES_PER_MONTH
    assert lines["Batch API: GET /v1/batches pages"].quantity == pages
    assert lines["Batch API: GET /v1/batches pages"].unit_price == pytest.approx(lst)
    page_reads = lines["Batch API: GET /v1/batches pages' S3 reads"]
    assert page_reads.quantity == pytest.approx(pages * 21)  # a full page of 20 and one more for has_more
    assert page_reads.unit_price == pytest.approx(get)
    retired = lines["Batch API: finished batches retired after 30 days"]
    assert (retired.quantity, retired.unit_price) == (batches, pytest.approx(get))
    deletes = lines["Batch API: finished batches' deletes"]
    assert (deletes.quantity, deletes.monthly_usd) == (4 * batches, 0)
    assert {line.group for line in lines.values()} == {"fixed"}
    # A longer night keeps more batches open at a tick; the finished ones move nothing the tick reads.
    overrides = {"cost_center": "cc", "batch_api": {"enabled": True}, "cost": {"nightly_hours": 8}}
    longer = _requests(load_stack_config("small", overrides))["Batch API: the tick's S3 reads"]
    # twice the hours, twice the open, and the rate's read in twice the ticks (open_now is under one batch here)
    assert open_now * 2 < 1
    assert longer.quantity - reads.quantity == pytest.approx(ticks * open_now * 2)


def test_the_request_lines_are_in_the_stacks_estimate_only_with_the_front() -> None:
    from infra.ops.stacks import stack_estimate

    def batch_api_lines(enabled: bool) -> list[str]:
        found = stack_estimate("small", None, {"batch_api.enabled": enabled}).items
        return [line.item for line in found if line.item.startswith("Batch API")]

    assert batch_api_lines(False) == []
    assert batch_api_lines(True)[-7:] == [line.item for line in request_items(_config(enabled=True))]
