"""Sending what the outbox holds (events.py): the tick's last step, on AWS and locally alike.

**Who sends.** Only the tick (the tiers' tick function, the local server's ticker), after its scheduling: every
front writes its changes' events into the batch records (batches.py), and the next tick sends them. So the
internet-facing function has no `events:PutEvents`, no webhooks secret and makes no outbound call; a change it
makes (a create, a queued batch cancelled at once) is sent within a tick (`batch_api.tick_minutes`, 5 on the
tiers; a second locally), and a cancel of a running batch at once, since the front asks the tick for its stop.

**A failed send loses nothing and holds up nothing.** The change is written before anything is sent, whatever
happens to the send; a failed send is tried again by a later tick, after an exponential backoff (`Retry`: 10 s,
doubling, at most an hour apart), up to `Retry.attempts` tries (12: about four and a half hours), then recorded
as `failed` in the batch's `_events` and said in one log line (the event's id, the batch, the target; never a
secret or a URL). The queue never waits on a send: sends come after the tick's work, each bounded by
`Retry.timeout_s` (10 s), and a tick starts no send once `Retry.budget_s` (30 s) has passed (the rest go next tick).

**At least once.** An event is marked sent only after the bus or the receiver answered; a tick that dies between
the answer and its write sends it again. A webhook's `webhook-id` (the event's id) is the same on every try, as
Standard Webhooks asks, so a receiver drops a repeat by it; an EventBridge event's `detail.event_id` likewise.
Within one batch, events go in the order of its changes: a failed send holds back that batch's later ones.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from workload.batch_api import events
from workload.batch_api.batches import BatchBook
from workload.batch_api.models import BatchRecord
from workload.batch_api.webhooks import Webhook, WebhookConfigError, WebhookSource


@dataclass(frozen=True)
class Retry:
    attempts: int = 12  # tries of one event to one target before it is given up
    first_s: float = 10.0  # the wait after the first failed try; each next one doubles
    cap_s: float = 3600.0  # the longest wait between two tries
    timeout_s: float = 10.0  # one webhook's connect and answer
    budget_s: float = 30.0  # a tick's sending at most (the tick function has 120 s in all)

    def delay(self, failures: int) -> float:
        return float(min(self.cap_s, self.first_s * 2 ** max(0, failures - 1)))


class EventBus(Protocol):
    def put(self, entry: dict[str, Any]) -> str | None:
        """Put one event (PutEvents' entry); None when the bus took it, else why not."""
        ...


@dataclass
class EventBridgeBus:
    """The stack's default event bus (`bus`: its name or ARN) through a boto3 `events` client."""

    client: Any
    bus: str

    def put(self, entry: dict[str, Any]) -> str | None:
        try:
            answer = self.client.put_events(Entries=[{**entry, "EventBusName": self.bus}])
        except Exception as error:  # throttled, unreachable, refused: tried again later
            return f"{type(error).__name__}: {error}"
        if answer.get("FailedEntryCount"):
            (failed,) = answer["Entries"]
            return f"{failed.get('ErrorCode')}: {failed.get('ErrorMessage')}"
        return None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is the receiver's error: a signed POST is not replayed elsewhere


_OPENER = urllib.request.build_opener(_NoRedirect)


def post_webhook(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> str | None:
    """POST one webhook; None when the receiver answered 2xx (Standard Webhooks' success), else why not."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        return type(error).__name__
    return None if 200 <= status < 300 else f"HTTP {status}"


@dataclass(frozen=True)
class EventConfig:
    """Where a service's batch events go (the service's `events`): `bus` (None: no bus), `hooks` (None: no
    webhooks); neither: nothing is recorded. `stack` names the stack in each event's detail."""

    stack: str = "local"
    bus: EventBus | None = None
    hooks: WebhookSource | None = None
    retry: Retry = Retry()
    post: Callable[[str, bytes, dict[str, str], float], str | None] = post_webhook
    wall: Callable[[], float] = time.time

    @property
    def outbox(self) -> events.Outbox:
        return events.Outbox(bus=self.bus is not None, webhooks=self.hooks is not None)


class EventSender:
    """Sends the outbox's pending events: to `bus` (None: no bus configured) and to each key's webhook (`hooks`:
    None, no webhooks configured). `stack` is the events' `detail.stack`."""

    def __init__(
        self,
        book: BatchBook,
        stack: str,
        bus: EventBus | None = None,
        hooks: WebhookSource | None = None,
        retry: Retry | None = None,
        post: Callable[[str, bytes, dict[str, str], float], str | None] = post_webhook,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.book, self.stack, self.bus, self.hooks = book, stack, bus, hooks
        self.retry = retry or Retry()
        self.post, self.wall = post, wall
        self.sent: Counter[str] = Counter()  # by target and outcome ("bus.sent", "hook.failed", ...), for tests

    def deliver(self) -> None:
        """Send what is due, batch by batch, within the tick's budget; write where each event stands."""
        deadline = time.monotonic() + self.retry.budget_s
        self._loaded: dict[str, Webhook] | str | None = None  # read when a webhook is first due, once a tick
        for record in self.book.with_events():
            if time.monotonic() >= deadline:
                return
            results = self._send(record, deadline)
            if results:
                self.book.settle(record.id, _apply(results))

    def _webhooks(self) -> dict[str, Webhook] | str:
        """The webhooks by owner, or why they cannot be read (that counts as a failed try of each due webhook, so
        a document that never loads gives them up after the bound rather than holding them for ever)."""
        if self._loaded is None:
            try:
                self._loaded = self.hooks.current() if self.hooks is not None else {}
            except WebhookConfigError as error:
                self._loaded = str(error)
        return self._loaded

    def _send(self, record: BatchRecord, deadline: float) -> dict[str, dict[str, Any]]:
        now = self.book.records.now()
        results: dict[str, dict[str, Any]] = {}
        bus_held = hook_held = False  # a failed send holds back this batch's later events (their order)
        for event in record.events or ():
            change: dict[str, Any] = {}
            if event.get("bus") == events.PENDING and not bus_held:
                if self.bus is None:
                    change["bus"] = events.NONE
                elif event.get("bus_next_at", 0) <= now and time.monotonic() < deadline:
                    change.update(self._put(record, event, now))
                bus_held = change.get("bus", events.PENDING) == events.PENDING
            if event.get("hook") == events.PENDING and not hook_held:
                if event["next_at"] <= now and time.monotonic() < deadline:
                    change.update(self._hook(record, event, now))
                hook_held = change.get("hook", events.PENDING) == events.PENDING
            if change:
                results[event["id"]] = change
        return results

    def _hook(self, record: BatchRecord, event: dict[str, Any], now: int) -> dict[str, Any]:
        hooks = self._webhooks()
        if isinstance(hooks, str):
            return self._outcome("hook", "hook_tries", "next_at", event, hooks, now, record, "its key's webhook")
        hook = hooks.get(record.owner)
        if hook is None:
            return {"hook": events.NONE}  # its key has no webhook
        return self._post(record, event, hook, now)

    def _put(self, record: BatchRecord, event: dict[str, Any], now: int) -> dict[str, Any]:
        assert self.bus is not None
        detail = events.detail(event, record, self.stack)
        entry = {
            "Source": events.SOURCE,
            "DetailType": events.DETAIL_TYPE,
            "Detail": _json(detail),
            "Time": event["at"],
            "Resources": [],
        }
        problem = self.bus.put(entry)
        return self._outcome("bus", "tries", "bus_next_at", event, problem, now, record, "the event bus")

    def _post(self, record: BatchRecord, event: dict[str, Any], hook: Webhook, now: int) -> dict[str, Any]:
        body = events.webhook_body(event, record.id)
        headers = events.signed_headers(event["id"], int(self.wall()), body, hook.secret)
        problem = self.post(hook.url, body, headers, self.retry.timeout_s)
        return self._outcome("hook", "hook_tries", "next_at", event, problem, now, record, f"key {hook.name}'s webhook")

    def _outcome(
        self, target: str, tries_field: str, next_field: str, event: dict[str, Any], problem: str | None,
        now: int, record: BatchRecord, where: str,
    ) -> dict[str, Any]:  # fmt: skip
        if problem is None:
            self.sent[f"{target}.sent"] += 1
            return {target: events.SENT}
        tries = int(event.get(tries_field, 0)) + 1
        if tries >= self.retry.attempts:
            self.sent[f"{target}.failed"] += 1
            print(
                f"llm-batch batch-api: event {event['id']} (batch {record.id}, {event['status']}) not delivered to "
                f"{where} after {tries} tries (last: {problem}); given up",
                file=sys.stderr,
                flush=True,
            )
            return {target: events.FAILED, tries_field: tries}
        self.sent[f"{target}.retry"] += 1
        return {tries_field: tries, next_field: now + self.retry.delay(tries)}


def _apply(results: dict[str, dict[str, Any]]) -> Callable[[BatchRecord], None]:
    def change(record: BatchRecord) -> None:
        record.events = [{**event, **results.get(event["id"], {})} for event in record.events or ()]

    return change


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
