"""The Batch API's S3 requests a month (issue 61): what its tick, its listings and its retention ask of the store,
priced from infra/facts/idle_prices.json (S3 Standard's GET and LIST prices, dated, with their source).

What each step asks, by the store's design (docs/batch-api.md, "What the tick and the pages read", measured there
at 0, 1,000 and 10,000 finished batches):
- a tick reads the open-batches index (1 GET) and each open batch's record (1 GET each), never a listing of the
  batches, so finished batches cost it nothing; while any batch is open, the measured throughput too (1 GET,
  workload/batch_api/at_risk.py: which batches would miss their window); it lists the other record kinds and
  the retention's queue (`TICK_LISTS`) and reads each record held there (the files a month's batches made, the
  nights); the tiers' tick then writes a metrics line from the open batches as the tick left them, with no read
  of its own;
- a `GET /v1/batches` page lists one page of order markers (1 LIST) and reads the batches it returns and one
  more, to say `has_more`;
- a finished batch goes once it has been listable for the retention: a GET of its record and a LIST of its job
  output, then DELETEs, which S3 does not bill, nor the lifecycle's expirations (the S3 FAQ, in the price table's
  source; the line shows the count at $0).

Volumes are assumptions, printed in each line: `BATCHES_PER_MONTH` (a few a night, as the front's
`API_REQUESTS_PER_MONTH` assumes, infra/pricing/batch_api_cost.py), each open from its upload until its night's
run is done, about `cost.nightly_hours` (so the open batches a tick finds, on average, follow the stack's
config), each with an input and an output file, and `LIST_PAGES_PER_MONTH` listing pages of OpenAI's default 20
(`client.batches.list()`'s first page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.pricing.estimate import HOURS_PER_MONTH, NIGHTS_PER_MONTH, LineItem, line_item
from infra.pricing.idle_cost import load_idle_prices

if TYPE_CHECKING:
    from infra.config import StackConfig

# What the service's tick asks (tests/infra/test_batch_api_tick_requests.py counts a real idle one).
TICK_INDEX_GETS = 1  # the open-batches index
# Files, tombstones, uploads, idempotency claims, the retention's queue, and the nights three times on the tiers
# (the queue's, the stranded starts', the retention's): counted on the merge of issue 61's branches, 2026-12-07.
TICK_LISTS = 8
# The tiers' tick function: the tick, then its metrics line, which counts the open batches as the tick left them
# (BatchService.statuses) with no read of its own.
FUNCTION_INDEX_GETS = TICK_INDEX_GETS
GETS_PER_OPEN_BATCH = 1
RATE_GETS = 1  # the measured throughput (records/control/throughput.json), read by a tick that finds a batch open
NIGHT_READS_PER_TICK = 3  # the nights are listed, and each read, three times
PAGE_LISTS = 1  # one page of order markers
PAGE_EXTRA_GETS = 1  # the batch after the page, for `has_more`
RETIRE_GETS, RETIRE_LISTS, RETIRE_DELETES = 1, 1, 4  # its record; its output; marker, output, record, queue entry
# Assumed use (see the module's docstring).
BATCHES_PER_MONTH = 90
FILES_PER_BATCH = 2  # its input and its output
LIST_PAGES_PER_MONTH = 1_000
PAGE_SIZE = 20  # OpenAI's default `limit` for GET /v1/batches
RETENTION_MONTHS = 30 * 24 / HOURS_PER_MONTH  # files, outputs and finished batches: 30 days (docs/batch-api.md)


def ticks_per_month(config: StackConfig) -> float:
    return HOURS_PER_MONTH * 60 / config.batch_api.tick_minutes


def open_batches(config: StackConfig) -> float:
    """The batches a tick finds open on average: each open about a night's run."""
    return BATCHES_PER_MONTH * config.cost.nightly_hours / HOURS_PER_MONTH


def held_records() -> float:
    """The records a tick reads besides the batches: the files kept for the retention, the retention's nights
    (each read `NIGHT_READS_PER_TICK` times). Idempotency claims and tombstones are left out: a day's at most."""
    files = BATCHES_PER_MONTH * RETENTION_MONTHS * FILES_PER_BATCH
    nights = NIGHTS_PER_MONTH * RETENTION_MONTHS * NIGHT_READS_PER_TICK
    return files + nights


def batches_per_page() -> float:
    """What a listing page returns: a full page once a month's batches are kept listable."""
    return min(PAGE_SIZE, BATCHES_PER_MONTH * RETENTION_MONTHS)


def request_items(config: StackConfig) -> list[LineItem]:
    """The Batch API's S3 request lines: nothing when it is off."""
    if not config.batch_api.enabled:
        return []
    table = load_idle_prices()
    prices = table.regions.get(config.region) or table.regions["us-east-1"]
    where = "" if config.region in table.regions else " (us-east-1 price)"
    ticks, found, held = ticks_per_month(config), open_batches(config), held_records()
    get, lst = prices.s3_get_per_1000 / 1000, prices.s3_list_per_1000 / 1000
    per_page = batches_per_page()
    items = [
        line_item(
            "fixed",
            f"Batch API: the tick's S3 reads (the open-batches index, {found:.2f} open batches, {held:.0f} files' and "
            f"nights' records; {ticks:,.0f} ticks){where}",
            # the rate's read: in the share of ticks that find a batch open, at most every tick
            ticks * (FUNCTION_INDEX_GETS + GETS_PER_OPEN_BATCH * found + RATE_GETS * min(1.0, found) + held),
            "request",
            get,
        ),
        line_item(
            "fixed",
            f"Batch API: the tick's S3 listings ({TICK_LISTS} a tick: no listing of the batches){where}",
            ticks * TICK_LISTS,
            "request",
            lst,
        ),
        line_item(
            "fixed",
            f"Batch API: GET /v1/batches pages (assumed {LIST_PAGES_PER_MONTH:,}: 1 S3 listing each){where}",
            LIST_PAGES_PER_MONTH * PAGE_LISTS,
            "request",
            lst,
        ),
        line_item(
            "fixed",
            f"Batch API: GET /v1/batches pages' S3 reads ({per_page:.0f} batches a page and one more){where}",
            LIST_PAGES_PER_MONTH * (per_page + PAGE_EXTRA_GETS),
            "request",
            get,
        ),
        line_item(
            "fixed",
            f"Batch API: finished batches retired after 30 days (assumed {BATCHES_PER_MONTH} a month: "
            f"{RETIRE_GETS} read and {RETIRE_LISTS} listing each){where}",
            BATCHES_PER_MONTH * RETIRE_GETS,
            "request",
            get,
        ),
        line_item(
            "fixed",
            f"Batch API: finished batches' output listings before their delete{where}",
            BATCHES_PER_MONTH * RETIRE_LISTS,
            "request",
            lst,
        ),
        line_item(
            "fixed",
            f"Batch API: finished batches' deletes ({RETIRE_DELETES} each; S3 bills no DELETE)",
            BATCHES_PER_MONTH * RETIRE_DELETES,
            "request",
            0.0,
        ),
    ]
    return items
