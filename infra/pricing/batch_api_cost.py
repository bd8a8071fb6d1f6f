"""The Batch API front's own lines in the estimate (batch_api.enabled): API Gateway HTTP API requests, Lambda
requests and GB-seconds, including the tick schedule's invocations, which run whether or not anyone calls, and
the queue's custom metrics, which every tick publishes (workload/batch_api/queue_metrics.py); with them, the
tick's and the listings' S3 requests (infra/pricing/batch_api_requests.py). Its alarms are counted with the
plan's others (infra/pricing/stack_costs.py).

Prices: infra/facts/batch_api_prices.json (dated, with its source; tests/infra/test_batch_api_cost.py fails when
it is older than infra.facts.MAX_AGE_DAYS). The Price List file the refresh tool reads (prices.json) has no
serverless prices; a region the table lacks is priced at us-east-1's and the line says so. The lines are gross:
Lambda's monthly free tier (1M requests, 400,000 GB-seconds) is the account's, shared with whatever else runs
there, so it is not subtracted. The request volume is an assumption, printed in the line.
"""

from __future__ import annotations

import json
from datetime import date
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.config import StackConfig
from infra.pricing.batch_api_requests import request_items
from infra.pricing.estimate import Estimate, LineItem
from workload.contract import metric_names as mn

PRICES_FILE = Path(__file__).resolve().parent.parent / "facts" / "batch_api_prices.json"
MINUTES_PER_MONTH = 730.0 * 60
# Assumed use: a few batches a night, each a few uploads (4 MiB parts, each billed as 8 requests of 512 KB),
# the client's polling every half minute while it runs, and its downloads.
API_REQUESTS_PER_MONTH = 20_000
REQUEST_SECONDS = 0.3  # a warm request: one or two S3 calls
TICK_SECONDS = 1.0  # a tick: list the records, describe the running execution
QUEUE_METRICS = len(mn.BATCH_API_METRICS)  # each billed every hour a tick publishes it


class FrontPrices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    http_api_per_million: float = Field(gt=0)
    lambda_requests_per_million: float = Field(gt=0)
    lambda_arm64_gb_second: float = Field(gt=0)
    cloudwatch_metric_month: float = Field(gt=0)


class FrontPriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    checked: date
    source: str = Field(min_length=20)
    how: str
    regions: dict[str, FrontPrices]


@cache
def load_front_prices() -> FrontPriceTable:
    return FrontPriceTable.model_validate(json.loads(PRICES_FILE.read_text()))


def _line(item: str, quantity: float, unit: str, unit_price: float) -> LineItem:
    return LineItem(
        group="fixed", item=item, quantity=quantity, unit=unit, unit_price=unit_price, monthly_usd=quantity * unit_price
    )


def front_items(config: StackConfig) -> list[LineItem]:
    """The front's month: nothing when it is off."""
    if not config.batch_api.enabled:
        return []
    table = load_front_prices()
    prices = table.regions.get(config.region) or table.regions["us-east-1"]
    where = "" if config.region in table.regions else " (us-east-1 price)"
    ticks = MINUTES_PER_MONTH / config.batch_api.tick_minutes
    gb = config.batch_api.memory_mb / 1024
    gb_seconds = ticks * TICK_SECONDS * gb + API_REQUESTS_PER_MONTH * REQUEST_SECONDS * gb
    millions = 1_000_000
    return [
        _line(
            f"Batch API: HTTP API requests (assumed {API_REQUESTS_PER_MONTH:,}){where}",
            API_REQUESTS_PER_MONTH / millions,
            "million requests",
            prices.http_api_per_million,
        ),
        _line(
            f"Batch API: Lambda requests ({ticks:,.0f} ticks + the API's){where}",
            (ticks + API_REQUESTS_PER_MONTH) / millions,
            "million requests",
            prices.lambda_requests_per_million,
        ),
        _line(f"Batch API: Lambda arm64 compute{where}", gb_seconds, "GB-second", prices.lambda_arm64_gb_second),
        _line(
            f"Batch API: the queue's CloudWatch metrics (queued, running, failed, expired, at risk){where}",
            QUEUE_METRICS,
            "metric-month",
            prices.cloudwatch_metric_month,
        ),
    ]


def with_front(result: Estimate, config: StackConfig) -> Estimate:
    """The estimate with the front's lines and its S3 requests added (the hook in
    infra.ops.stacks.stack_estimate)."""
    return result.model_copy(update={"items": (*result.items, *front_items(config), *request_items(config))})
