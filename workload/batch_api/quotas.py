"""What one caller may hold (issue 60): quotas per owner, checked before a batch, a file, an Upload or a part is
made, and the bounds on each request's `n` and token budget.

A quota counts what the owner holds now (open batches and their requests, files and their bytes, pending Uploads,
an Upload's parts), read from the records just before the write: two calls racing past the same count can both
pass, so a quota may be overrun by the calls in flight at that moment, never further. A refusal is OpenAI's 429
(`type: requests`, `code: rate_limit_exceeded`, as its rate limits answer), which the official client raises as
`openai.RateLimitError`; it retries a 429 itself (`max_retries`, 2 by default), which is harmless here: the
retry is refused again until the owner holds less. A request over a bound (`n`, `max_tokens`,
`max_completion_tokens`, `max_output_tokens`) is a 400 at create naming the line (`openai.BadRequestError`): the
batch is never queued, so its job never sees it.

The quotas themselves are the contract's `BatchApiQuotas`: the AWS tiers set them from the stack's
`batch_api.quotas` (infra/components/batch_api.py passes them as LLM_BATCH_QUOTA_* to the front), the local server
from its `--quota-*` flags (cli_quotas.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from workload.batch_api.batches import BatchBook
from workload.batch_api.models import FileRecord, UploadRecord
from workload.batch_api.objects import ApiError
from workload.batch_api.records import Records
from workload.contract.batch_api_quotas import BatchApiQuotas

# The body fields that bound a request's output: chat (`max_tokens`, its newer name `max_completion_tokens`),
# completions (`max_tokens`) and the Responses API's `max_output_tokens`.
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


Quotas = BatchApiQuotas  # the contract's model (workload/contract/batch_api_quotas.py), shared with the stack


def over_quota(message: str, param: str | None = None) -> ApiError:
    """OpenAI's 429, as its rate limits answer; the message names the quota and the limit."""
    return ApiError(429, f"quota reached: {message}", param, code="rate_limit_exceeded", error_type="requests")


def check_holding(what: str, holds: int, adding: int, most: int, param: str | None = None) -> None:
    """Refuse (429) when `adding` more to the `holds` the owner has would pass `most`."""
    if holds + adding > most:
        raise over_quota(f"this key holds {holds} {what}; it may hold at most {most}", param)


def check_request_bounds(number: int, line: bytes, quotas: Quotas) -> None:
    """Refuse (400, naming the line) a request whose `n` or output budget is over the server's bound. A line that
    is not a JSON object with a body is left to the input's own validation (service.py), which reports it."""
    try:
        value = json.loads(line)
    except ValueError:
        return
    body = value.get("body") if isinstance(value, dict) else None
    if not isinstance(body, dict):
        return
    checks: Iterable[tuple[str, int]] = [("n", quotas.max_n), *((name, quotas.max_tokens) for name in TOKEN_FIELDS)]
    for name, most in checks:
        asked: Any = body.get(name)
        if asked is None:
            continue
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise ApiError(400, f"line {number}: body.{name} must be a positive integer, got {asked!r}", name)
        if asked > most:
            raise ApiError(400, f"line {number}: body.{name} is {asked}; this server takes at most {most}", name)


class Holdings:
    """What an owner holds now, read from the records, and the checks against its quotas."""

    def __init__(self, records: Records, batches: BatchBook, quotas: Quotas) -> None:
        self.records, self.batches, self.quotas = records, batches, quotas

    def file_room(self, owner: str) -> int:
        """Bytes the owner may still store; refused (429) when it holds its count of files or its bytes."""
        mine = [record for record in self.records.all(FileRecord) if record.owner == owner]
        check_holding("files", len(mine), 1, self.quotas.files, "file")
        stored = sum(record.bytes for record in mine)
        check_holding("bytes of files", stored, 1, self.quotas.file_bytes, "file")
        return self.quotas.file_bytes - stored

    def check_upload(self, owner: str, declared: int) -> None:
        """An Upload is the file it will make: the owner's file quotas, and its pending Uploads with their bytes."""
        room = self.file_room(owner)
        pending = [
            record
            for record in self.records.all(UploadRecord)
            if record.owner == owner and record.status == "pending" and self.records.now() < record.expires_at
        ]
        check_holding("pending uploads", len(pending), 1, self.quotas.open_uploads, "bytes")
        promised = sum(record.bytes for record in pending)
        if promised + declared > room:
            held = self.quotas.file_bytes - room + promised
            message = f"this key holds {held} bytes of files and pending uploads; it may hold at most"
            raise over_quota(f"{message} {self.quotas.file_bytes}, and this upload declares {declared}", "bytes")

    def check_batch(self, owner: str, requests: int) -> None:
        """A new batch of `requests` beside the owner's open ones (queued or running) and their requests."""
        # the open-batches index, not every batch: a create costs what is open (issue 61)
        open_ = [record for record in self.batches.open() if record.owner == owner]
        check_holding("open batches", len(open_), 1, self.quotas.open_batches, "input_file_id")
        enqueued = sum(record.request_counts.total for record in open_)
        check_holding("enqueued requests", enqueued, requests, self.quotas.enqueued_requests, "input_file_id")
