"""The Batch API front's lines in the estimate (infra/pricing/batch_api_cost.py) and the age of their prices."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from infra import facts
from infra.config import StackConfig, load_stack_config
from infra.pricing import batch_api_cost
from infra.pricing.batch_api_cost import front_items, load_front_prices


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
    assert (metrics.quantity, metrics.monthly_usd) == (4, pytest.approx(1.2))  # $0.30 a metric, every hour published
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
