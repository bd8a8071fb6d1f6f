"""A batch's state changes as events (issue 63): what is recorded with the change, and the two shapes it is sent in.

**Recorded with the change (the outbox).** Every change of a batch's status is written into the batch's own record
(`_events`, never in a response), by the same compare-and-swap write that changes the status (batches.py
`BatchBook.update` and `create`). So a change is never without its event, and an event never without its change,
whichever front wrote it and however it died after; the tick sends what is pending (event_delivery.py). Nothing is
recorded where nothing would be sent (no event bus and no webhooks configured: the local server by default).

**On the stack's default event bus (EventBridge).** Modelled on Amazon Bedrock's batch inference events, as AWS
documents them (docs.aws.amazon.com/bedrock/latest/userguide/monitoring-eventbridge-how-it-works.html,
read 2026-12-07):

- where: Bedrock sends each state change of a job to the account's default event bus; here each status change of
  a batch, its creation included, goes to the stack's default bus.
- `source`: Bedrock's is `aws.bedrock` (`aws.` is AWS's own; PutEvents refuses it to others); here
  `llm-batch.batch-api` (`SOURCE`).
- `detail-type`: Bedrock's `Batch Inference Job State Change`; here `llm-batch Batch State Change` (`DETAIL_TYPE`).
- `detail`: the page's model customization sample carries `version` (`"0.0"`), the job's name and ARN, its status
  and a `failureMessage`; the batch sample sits in a tab the text read here did not hold, but the guide's example
  rule matches `detail.status` (`["Completed"]`) and public handlers read `detail.batchJobArn`, `batchJobName` and
  `status`. Here: `version` (`DETAIL_VERSION`), `batch_id`, `previous_status`, `status`, `errors`,
  `request_counts`, `usage` and the rest of `detail()` below (docs/batch-api.md has the schema).
- delivery: Bedrock's is "best effort" (EventBridge's events reference, Amazon Bedrock); here at least once (a
  send whose reply was lost is sent again), `detail.event_id` telling the repeats apart.

The detail's names are OpenAI's Batch object's (snake case), which an integrator of this API already reads, not
Bedrock's camel case. The rule Bedrock's guide gives (`{"source": ["aws.bedrock"], "detail-type": [...],
"detail": {"status": ["Completed"]}}`) reads the same here with this source, detail-type and `"completed"`.

**As OpenAI's webhooks, per key.** A batch that closes (`completed`, `failed`, `expired`, `cancelled`) is also
`batch.<status>` to its key's webhook, if the key has one (webhooks.py): OpenAI's body `{"id": "evt_...",
"object": "event", "created_at": <when it closed>, "type": "batch.completed", "data": {"id": "batch_..."}}`
(openai.types.webhooks.BatchCompletedWebhookEvent and its siblings), signed per Standard Webhooks: headers
`webhook-id` (the event's id, the same on every try), `webhook-timestamp` (the try's, in seconds) and
`webhook-signature` `v1,<base64 HMAC-SHA256 of "id.timestamp.body">` under the key's `whsec_` secret, which the
official SDK's `client.webhooks.unwrap(body, headers, secret=...)` checks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from workload.batch_api.models import BatchRecord
from workload.batch_api.objects import TERMINAL

SOURCE = "llm-batch.batch-api"
DETAIL_TYPE = "llm-batch Batch State Change"
DETAIL_VERSION = "1"
WEBHOOK_TYPES = {status: f"batch.{status}" for status in sorted(TERMINAL)}  # OpenAI's four batch events
# A target's state in an event's entry: to be sent, sent, given up, or not asked for (no webhook for its key).
PENDING, SENT, FAILED, NONE = "pending", "sent", "failed", "none"
SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class Outbox:
    """What a batch's change records: an event for the bus, a webhook for its key; neither: nothing recorded."""

    bus: bool = False
    webhooks: bool = False

    @property
    def on(self) -> bool:
        return self.bus or self.webhooks


def event_id(batch_id: str, previous: str | None, status: str, changed_at: int) -> str:
    """The event's id: derived from the change, so a write redone after a lost race records the same id."""
    return "evt_" + hashlib.sha256(f"{batch_id}:{previous}:{status}:{changed_at}".encode()).hexdigest()[:24]


def entry(previous: str | None, record: BatchRecord, now: int, bus: bool, webhooks: bool) -> dict[str, Any]:
    """The outbox's entry for `record`'s change from `previous` (None: its creation), as written with it.

    It holds what the event says as of the change (a later change does not alter an earlier event) and where each
    target stands: `bus` and `hook` are PENDING, SENT, FAILED or NONE; `tries`/`hook_tries` count the failed
    sends; `next_at` is when the webhook is tried next (event_delivery.py's backoff)."""
    closed = record.status in TERMINAL
    return {
        "id": event_id(record.id, previous, record.status, now),
        "previous_status": previous,
        "status": record.status,
        "at": now,
        "request_counts": record.request_counts.model_dump(),
        "usage": record.usage if closed else None,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "errors": (record.errors or {}).get("data") if record.status == "failed" else None,
        "bus": PENDING if bus else NONE,
        "hook": PENDING if webhooks and record.status in WEBHOOK_TYPES else NONE,
        "tries": 0,
        "hook_tries": 0,
        "next_at": now,
    }


def pending(event: dict[str, Any]) -> bool:
    return PENDING in (event.get("bus"), event.get("hook"))


def undelivered(record: BatchRecord) -> bool:
    """Whether one of the batch's events is still to be sent (a closed batch stays in the open index till then)."""
    return any(pending(event) for event in record.events or ())


def key_name(owner: str) -> str | None:
    """The key's name an owner stands for (tenants.py: `key-NAME`); None for the project and the keyless server."""
    return owner[len("key-") :] if owner.startswith("key-") else None


def detail(event: dict[str, Any], record: BatchRecord, stack: str) -> dict[str, Any]:
    """The EventBridge event's `detail` (docs/batch-api.md, "Events and webhooks", has the schema)."""
    return {
        "version": DETAIL_VERSION,
        "event_id": event["id"],
        "stack": stack,
        "batch_id": record.id,
        "owner": record.owner,
        "key_name": key_name(record.owner),
        "previous_status": event["previous_status"],
        "status": event["status"],
        "changed_at": event["at"],
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "endpoint": record.endpoint,
        "model": record.model,
        "request_counts": event["request_counts"],
        "usage": event["usage"],
        "output_file_id": event["output_file_id"],
        "error_file_id": event["error_file_id"],
        "errors": event["errors"],
    }


def webhook_body(event: dict[str, Any], batch_id: str) -> bytes:
    """OpenAI's webhook event for a closed batch (openai.types.webhooks.Batch*WebhookEvent)."""
    body = {
        "id": event["id"],
        "object": "event",
        "created_at": event["at"],
        "type": WEBHOOK_TYPES[event["status"]],
        "data": {"id": batch_id},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def secret_bytes(secret: str) -> bytes:
    """A `whsec_` secret's key: the base64 after the prefix (Standard Webhooks; the SDK decodes it the same)."""
    return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)


def signed_headers(message_id: str, timestamp: int, body: bytes, secret: str) -> dict[str, str]:
    """Standard Webhooks' three headers for one try: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()).decode()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{signature}",
        "content-type": "application/json",
        "user-agent": "llm-batch-webhooks/1",
    }
