"""A batch's state changes as events (issue 63; workload/batch_api/events.py, event_delivery.py, webhooks.py).

The service and its scheduler on a real LocalStore and the test's clock, the job's side scripted (Scripted, as in
test_batch_api_metrics.py). Webhooks go over HTTP to a real receiver on 127.0.0.1 and are checked by the official
SDK's `client.webhooks.unwrap`; EventBridge is a moto server, whose rule on the default bus forwards to SQS."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from openai import OpenAI
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from tests.workload.test_batch_api import Clock, _line
from tests.workload.test_batch_api_lambda import KEY, Front, stack  # noqa: F401 (the fixture, used by name)
from tests.workload.test_batch_api_metrics import Scripted, _job_finishes
from workload.auth.entries import key_id
from workload.batch_api import events, lambda_front
from workload.batch_api.batch_index import OPEN_ID, OpenBatches
from workload.batch_api.cli import local_events
from workload.batch_api.event_delivery import EventBridgeBus, EventConfig, Retry
from workload.batch_api.executor import RunState
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore
from workload.batch_api.webhooks import WebhookConfigError, WebhookSource, parse_webhooks

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
CHAT = "/v1/chat/completions"
TEAM = "key-team-a"  # the owner of key `team-a`'s batches (tenants.py)


class Receiver:
    """A webhook receiver on 127.0.0.1: answers each POST with the next of `answers` (then 200); an answer of
    None never answers (holds the connection until the test ends)."""

    def __init__(self, answers: list[int | None] | None = None) -> None:
        self.answers = list(answers or [])
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                answer = receiver.answers.pop(0) if receiver.answers else 200
                if answer is None:
                    receiver.release.wait(10)
                    return
                self.send_response(answer)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


def _service(tmp_path: Path, config: EventConfig) -> BatchService:
    return BatchService(LocalStore(tmp_path / "data"), Scripted(), "llm-batch", clock=Clock(), events=config)


def _hooks(tmp_path: Path, url: str) -> WebhookSource:
    path = tmp_path / "webhooks.txt"
    path.write_text(f"# key name, receiver, signing secret\nteam-a {url} {SECRET}\n")
    return WebhookSource(path=path)


def _batch(service: BatchService, owner: str, lines: str = _line("a") + _line("b")) -> str:
    file_id = service.upload_file(owner, "in.jsonl", "batch", [lines.encode()])["id"]
    return str(service.create_batch(owner, file_id, CHAT, "24h")["id"])


def _unwrap(headers: dict[str, str], body: bytes) -> Any:
    return OpenAI(api_key="unused", base_url="http://127.0.0.1:9").webhooks.unwrap(body, headers, secret=SECRET)


def _stored_events(service: BatchService, batch_id: str) -> list[dict[str, Any]]:
    record = service.batches.get(batch_id)
    assert record is not None
    return list(record.events or [])


def test_each_close_is_its_keys_openai_webhook_which_the_official_sdk_unwraps(
    tmp_path: Path, receiver: Receiver
) -> None:
    service = _service(tmp_path, EventConfig(hooks=_hooks(tmp_path, receiver.url)))
    executor: Scripted = service.executor  # type: ignore[assignment]
    done, broken, queued = (_batch(service, TEAM) for _ in range(3))
    empty = _batch(service, TEAM, "\n")  # failed at create: its file holds no request
    other = _batch(service, "key-team-b")  # a key without a webhook: nothing is sent for it
    service.cancel_batch(TEAM, queued)  # queued: cancelled at once
    service.tick()  # sends the two closes so far; `done` starts
    _job_finishes(service, done, wall_s=10.0, cost_usd=0.01)
    executor.states[done] = RunState("succeeded")
    service.tick()  # `done` completes; `broken` starts
    executor.states[broken] = RunState("failed", "JobFailed: CUDA out of memory")
    service.tick()  # `broken` fails; `other` starts
    service.clock.now += 24 * 3600  # type: ignore[attr-defined]
    service.tick()  # `other` expires (no webhook for its key)

    got = {}
    for headers, body in receiver.got:
        event = _unwrap(headers, body)  # the signature, checked by the SDK (InvalidWebhookSignatureError if not)
        assert headers["webhook-id"] == event.id and event.object == "event"
        got[event.data.id] = event
    assert set(got) == {done, broken, queued, empty} and len(receiver.got) == 4  # each once
    assert isinstance(got[done], BatchCompletedWebhookEvent) and got[done].type == "batch.completed"
    assert isinstance(got[broken], BatchFailedWebhookEvent) and isinstance(got[empty], BatchFailedWebhookEvent)
    assert isinstance(got[queued], BatchCancelledWebhookEvent)
    assert got[done].created_at == service.get_batch(TEAM, done)["completed_at"]  # when it closed
    assert service.get_batch("key-team-b", other)["status"] == "expired"
    assert [e["hook"] for e in _stored_events(service, other)][-1] == events.NONE
    # Every batch is closed and settled: none is left in the open index, and nothing is public of it.
    assert service.batches.index.open_ids() == {}
    assert "_events" not in service.get_batch(TEAM, done) and "events" not in service.get_batch(TEAM, done)
    # A wrong secret does not verify: the signature is the key's.
    other_secret = "whsec_" + base64.b64encode(b"x" * 32).decode()
    headers, body = receiver.got[0]
    with pytest.raises(Exception, match="signature"):
        OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret=other_secret)


def test_an_expiry_is_batch_expired(tmp_path: Path, receiver: Receiver) -> None:
    service = _service(tmp_path, EventConfig(hooks=_hooks(tmp_path, receiver.url)))
    batch_id = _batch(service, TEAM)
    service.clock.now += 24 * 3600  # type: ignore[attr-defined]
    service.tick()
    ((headers, body),) = receiver.got
    event = _unwrap(headers, body)
    assert isinstance(event, BatchExpiredWebhookEvent) and event.data.id == batch_id


def test_a_receiver_failing_twice_gets_the_event_once_more_with_the_same_id(tmp_path: Path) -> None:
    receiver = Receiver([500, 503])
    try:
        retry = Retry(first_s=10, cap_s=3600)
        service = _service(tmp_path, EventConfig(hooks=_hooks(tmp_path, receiver.url), retry=retry))
        batch_id = _batch(service, TEAM)
        service.cancel_batch(TEAM, batch_id)
        service.tick()
        assert len(receiver.got) == 1
        service.tick()  # within the backoff (10 s): not tried
        assert len(receiver.got) == 1
        service.clock.now += 10  # type: ignore[attr-defined]
        service.tick()
        assert len(receiver.got) == 2
        service.clock.now += 19  # type: ignore[attr-defined]
        service.tick()  # the second wait is 20 s
        assert len(receiver.got) == 2
        service.clock.now += 1  # type: ignore[attr-defined]
        service.tick()
        service.tick()  # sent: never again
    finally:
        receiver.close()
    assert len(receiver.got) == 3
    ids = {headers["webhook-id"] for headers, _ in receiver.got}
    assert len(ids) == 1 and {body for _, body in receiver.got} == {receiver.got[0][1]}
    assert all(_unwrap(headers, body).data.id == batch_id for headers, body in receiver.got)
    (event,) = [e for e in _stored_events(service, batch_id) if e["status"] == "cancelled"]
    assert (event["hook"], event["hook_tries"]) == (events.SENT, 2)


def test_a_receiver_that_never_answers_is_given_up_after_the_bound_and_the_queue_moves_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receiver = Receiver([None, None, None])
    try:
        retry = Retry(attempts=3, first_s=1, timeout_s=0.2)
        service = _service(tmp_path, EventConfig(hooks=_hooks(tmp_path, receiver.url), retry=retry))
        cancelled = _batch(service, TEAM)
        service.cancel_batch(TEAM, cancelled)
        waiting = _batch(service, TEAM)
        for _ in range(3):
            service.tick()
            service.clock.now += 10  # type: ignore[attr-defined]
        service.tick()  # given up: not tried a fourth time
    finally:
        receiver.close()
    assert len(receiver.got) == 3
    (event,) = [e for e in _stored_events(service, cancelled) if e["status"] == "cancelled"]
    assert (event["hook"], event["hook_tries"]) == (events.FAILED, 3)
    assert service.get_batch(TEAM, waiting)["status"] == "in_progress"  # the queue went on meanwhile
    assert cancelled not in service.batches.index.open_ids()  # settled: out of the open index
    log = capsys.readouterr().err
    assert f"event {event['id']} (batch {cancelled}, cancelled) not delivered to key team-a's webhook" in log
    assert "after 3 tries" in log and SECRET not in log and receiver.url not in log


class FlakyBus:
    """A bus that refuses the first `refusals` puts (an outage, a throttle), then takes them all."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.taken = refusals, list[dict[str, Any]]()

    def put(self, entry: dict[str, Any]) -> str | None:
        if self.refusals:
            self.refusals -= 1
            return "ThrottlingException: Rate exceeded"
        self.taken.append(entry)
        return None


def test_a_refused_put_keeps_the_change_and_the_event_which_a_later_tick_sends_in_order(tmp_path: Path) -> None:
    bus = FlakyBus(refusals=1)
    service = _service(tmp_path, EventConfig(stack="small", bus=bus, retry=Retry(first_s=5)))
    batch_id = _batch(service, TEAM)
    service.tick()  # the create's put is refused; the batch starts all the same
    assert service.get_batch(TEAM, batch_id)["status"] == "in_progress" and bus.taken == []
    created, started = _stored_events(service, batch_id)
    assert (created["bus"], created["tries"], started["bus"]) == (events.PENDING, 1, events.PENDING)
    service.clock.now += 5  # type: ignore[attr-defined]
    service.tick()
    assert [json.loads(e["Detail"])["status"] for e in bus.taken] == ["validating", "in_progress"]  # in order
    assert all(e["bus"] == events.SENT for e in _stored_events(service, batch_id))


def test_nothing_is_recorded_without_a_bus_or_a_webhook(tmp_path: Path) -> None:
    service = BatchService(LocalStore(tmp_path / "data"), Scripted(), "llm-batch", clock=Clock())
    batch_id = _batch(service, TEAM)
    service.tick()
    assert _stored_events(service, batch_id) == [] and service.events is None


def test_a_bad_webhooks_document_is_refused_naming_the_entry_never_the_secret() -> None:
    with pytest.raises(WebhookConfigError, match=r"line 1 of the webhooks \(team-a\): the url must be https"):
        parse_webhooks(f"team-a http://example.com/hooks {SECRET}")
    with pytest.raises(WebhookConfigError, match="must start with 'whsec_'") as raised:
        parse_webhooks('{"webhooks": [{"name": "team-a", "url": "https://h.example/x", "secret": "hunter2"}]}')
    assert "hunter2" not in str(raised.value)
    hooks = parse_webhooks(f"@local http://localhost:9/x {SECRET}\nteam-a https://h.example/x {SECRET}")
    assert sorted(hooks) == [TEAM, "local"] and SECRET not in repr(hooks)


def test_every_state_change_is_an_event_on_the_default_bus(moto_reset: str, tmp_path: Path) -> None:
    """moto's EventBridge applies the rule's pattern to PutEvents and forwards to the SQS target, as AWS does."""
    sqs, bridge = boto3.client("sqs"), boto3.client("events")
    queue = sqs.create_queue(QueueName="batch-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    pattern = {"source": [events.SOURCE], "detail-type": [events.DETAIL_TYPE]}
    bridge.put_rule(Name="batch-events", EventPattern=json.dumps(pattern), EventBusName="default")
    bridge.put_targets(Rule="batch-events", EventBusName="default", Targets=[{"Id": "q", "Arn": queue_arn}])
    bus = EventBridgeBus(bridge, "default")
    service = _service(tmp_path, EventConfig(stack="small", bus=bus))
    executor: Scripted = service.executor  # type: ignore[assignment]
    first, second = _batch(service, TEAM), _batch(service, TEAM)
    service.tick()  # first starts
    _job_finishes(service, first, wall_s=10.0, cost_usd=0.01)
    executor.states[first] = RunState("succeeded")
    service.tick()  # first completes, second starts
    service.cancel_batch(TEAM, second)
    service.tick()  # the stop; the stopped run closes it
    service.tick()
    assert service.get_batch(TEAM, second)["status"] == "cancelled"

    received = []
    while messages := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages"):
        for message in messages:
            received.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    assert {e["source"] for e in received} == {events.SOURCE}
    assert {e["detail-type"] for e in received} == {events.DETAIL_TYPE}
    changes = {
        batch_id: [(e["detail"]["previous_status"], e["detail"]["status"]) for e in received
                   if e["detail"]["batch_id"] == batch_id]
        for batch_id in (first, second)
    }  # fmt: skip
    assert changes[first] == [(None, "validating"), ("validating", "in_progress"), ("in_progress", "completed")]
    assert changes[second] == [
        (None, "validating"), ("validating", "in_progress"), ("in_progress", "cancelling"),
        ("cancelling", "cancelled"),
    ]  # fmt: skip
    (closed,) = [e["detail"] for e in received if e["detail"]["status"] == "completed"]
    assert closed["usage"]["input_tokens"] == 20 and closed["request_counts"]["completed"] == 2
    assert (closed["stack"], closed["owner"], closed["key_name"], closed["version"]) == (
        "small", TEAM, "team-a", events.DETAIL_VERSION,
    )  # fmt: skip
    assert len({e["detail"]["event_id"] for e in received}) == len(received)


def test_on_the_tiers_the_front_records_and_the_tick_sends_to_the_bus_and_the_keys_webhook(
    stack: dict[str, str],  # noqa: F811 (the fixture, by name)
    receiver: Receiver,
) -> None:
    """The HTTP function records its changes' events (it may not send: no events:PutEvents, no webhooks secret
    in its role); the tick function, built from the same environment, sends them: to the default bus (moto:
    rule -> SQS) and to the key's webhook, whose URL and secret it reads from Secrets Manager."""
    sqs, bridge = boto3.client("sqs"), boto3.client("events")
    queue = sqs.create_queue(QueueName=f"events-{stack['LLM_BATCH_BUCKET']}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = f"rule-{stack['LLM_BATCH_BUCKET']}"
    bridge.put_rule(Name=rule, EventPattern=json.dumps({"source": [events.SOURCE]}))
    bridge.put_targets(Rule=rule, Targets=[{"Id": "q", "Arn": queue_arn}])
    name = key_id(KEY)  # the test key has no name: its digest prefix names it (workload/auth/entries.py)
    document = {"webhooks": [{"name": name, "url": receiver.url, "secret": SECRET}]}
    hooks = boto3.client("secretsmanager").create_secret(
        Name=f"{stack['LLM_BATCH_BUCKET']}-webhooks", SecretString=json.dumps(document)
    )
    default_bus = bridge.describe_event_bus(Name="default")["Arn"]
    env = {**stack, "LLM_BATCH_EVENT_BUS": default_bus, "LLM_BATCH_WEBHOOKS_SECRET": hooks["ARN"]}

    front = Front(lambda_front.build_handler(env))
    empty = front.call("POST", "/v1/files", files={"file": ("e.jsonl", b"\n")}, data={"purpose": "batch"})
    request = {"input_file_id": json.loads(empty[2])["id"], "endpoint": CHAT, "completion_window": "24h"}
    status, _, raw = front.call("POST", "/v1/batches", json=request)
    assert status == 200 and json.loads(raw)["status"] == "failed", raw
    assert receiver.got == [] and sqs.receive_message(QueueUrl=queue).get("Messages") is None  # only recorded

    lambda_front.build_service(env).tick()  # the tick function's service
    ((headers, body),) = receiver.got
    event = _unwrap(headers, body)
    assert isinstance(event, BatchFailedWebhookEvent) and event.data.id == json.loads(raw)["id"]
    (message,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    sent = json.loads(message["Body"])
    assert (sent["detail"]["previous_status"], sent["detail"]["status"]) == (None, "failed")
    assert sent["detail"]["event_id"] == event.id and sent["detail"]["key_name"] == name


def test_a_lost_open_index_is_rebuilt_with_the_closed_batches_whose_events_wait(tmp_path: Path) -> None:
    service = _service(tmp_path, EventConfig(bus=FlakyBus(refusals=100)))
    batch_id = _batch(service, TEAM, "\n")  # failed at create; its event's put is refused
    service.tick()
    assert batch_id in service.batches.index.open_ids()
    service.store.delete(OpenBatches.KIND, OPEN_ID)  # the index lost: rebuilt from a listing of the batches
    assert batch_id in service.batches.index.rebuild().open


def test_the_local_servers_webhooks_file_is_read_at_start(tmp_path: Path) -> None:
    short = "whsec_" + base64.b64encode(b"x" * 8).decode()
    bad = tmp_path / "webhooks.txt"
    bad.write_text(f"team-a https://h.example/x {short}\n")
    with pytest.raises(WebhookConfigError, match=r"\(team-a\): the secret must hold 24 to 64 bytes, it holds 8"):
        local_events(str(bad), None)  # the server refuses to start (cli.py prints it, exit 2)
    assert local_events(None, None) is None  # neither flag: nothing recorded, nothing sent
    good = _hooks(tmp_path, "https://h.example/x")
    config = local_events(str(good.path), None)
    assert config is not None and config.bus is None and config.outbox.webhooks
