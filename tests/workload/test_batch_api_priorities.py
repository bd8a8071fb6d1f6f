"""Issue 62, first part: priorities per key and per batch, the queue's order, and the at-risk report.

The real app on a real uvicorn server with the official client, over the service and its scheduler on a real
LocalStore and the test's clock; the job's side is scripted (`Runs`: the tiers' executor is run against moto in
test_batch_api_sfn.py, the job itself in test_batch_api_e2e.py), since what is checked here is which batch the
queue starts next and what it reports, not how a job runs. No test waits: the clock is moved."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch
from pydantic import ValidationError

from infra.ops.status_batches import _row, render_batches
from tests.workload.served_app import ServedApp
from tests.workload.test_batch_api import Clock, _line
from tests.workload.test_batch_api_metrics import Scripted, _values
from workload.auth.keys import ApiKeys, KeySource
from workload.batch_api import at_risk
from workload.batch_api.app import build_app
from workload.batch_api.cli_quotas import add_quota_arguments, quotas_from_args
from workload.batch_api.executor import RunState
from workload.batch_api.models import BatchRecord, NightEntry
from workload.batch_api.priorities import queue_order
from workload.batch_api.queue_metrics import QueueMetrics
from workload.batch_api.quotas import Quotas
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore
from workload.contract.batch_api_priorities import parse_priorities

CHAT = "/v1/chat/completions"
KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}
PRIORITIES = {"team-a": 5}  # team-b is not listed: the default, 0
DAY = 24 * 3600


class Runs(Scripted):
    """Scripted (test_batch_api_metrics.py), remembering the order the scheduler started runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []

    def start(self, run: Any) -> None:
        if run.batch_id not in self.states:
            self.started.append(run.batch_id)
        super().start(run)


class Api:
    def __init__(self, tmp: Path) -> None:
        self.clock, self.runs = Clock(), Runs()
        self.store = LocalStore(tmp / "data")
        quotas = Quotas(priorities=PRIORITIES)
        self.service = BatchService(self.store, self.runs, "llm-batch", clock=self.clock, quotas=quotas)
        keys_file = tmp / "keys"
        keys_file.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
        app = build_app(self.service, ApiKeys(KeySource(key=None, key_file=keys_file)), "key")
        self.served = ServedApp(app)

    def client(self, team: str) -> openai.OpenAI:
        return self.served.client(KEYS[team])

    def batch(self, team: str, rows: int, priority: str | None = None) -> str:
        client = self.client(team)
        text = "".join(_line(f"{team}-{n}") for n in range(rows))
        upload = client.files.create(file=("in.jsonl", text.encode()), purpose="batch")
        metadata = None if priority is None else {"llm_batch_priority": priority}
        return client.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h", metadata=metadata
        ).id

    def finish(self, batch_id: str, rows: int, wall_s: float) -> None:
        """What the job leaves when it ends (workload/job/output.py's layout), then a tick that closes it."""
        output = f"batches/{batch_id}/output"
        lines = "".join(json.dumps({"custom_id": str(n)}) + "\n" for n in range(rows)).encode()
        self.store.write_blob(f"{output}/output.jsonl", [lines])
        summary = {"rows_in": rows, "input_tokens": rows, "output_tokens": rows, "wall_s": wall_s, "cost_usd": 0.0}
        self.store.write_blob(f"{output}/summary.json", [json.dumps(summary).encode()])
        self.runs.states[batch_id] = RunState("succeeded")
        self.service.tick()

    def stop(self) -> None:
        self.served.stop()
        self.store.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    running = Api(tmp_path)
    yield running
    running.stop()


def test_priority_order_holds_over_a_queue_of_five(api: Api) -> None:
    """Five batches of two keys, created in an order that is not the order they must run in: the key's priority
    first, a batch's own lower one where it asks, then the oldest among equals."""
    b_first = api.batch("team-b", 1)  # 0, the oldest
    a_behind = api.batch("team-a", 1, priority="-3")  # team-a's, stepped back behind team-b's
    a_urgent = api.batch("team-a", 1)  # 5: the key's
    b_second = api.batch("team-b", 1)  # 0, after b_first
    a_lowered = api.batch("team-a", 1, priority="2")  # lower than its key's, still ahead of team-b
    expected = [a_urgent, a_lowered, b_first, b_second, a_behind]
    api.service.tick()
    for running in expected:
        assert api.runs.started[-1] == running
        api.finish(running, rows=1, wall_s=1.0)  # the tick that closes it starts the next one
    assert api.runs.started == expected
    assert {api.service.batches.get(b).status for b in expected} == {"completed"}  # type: ignore[union-attr]


def test_a_batch_may_lower_its_keys_priority_never_raise_it(api: Api) -> None:
    """The metadata key is checked at create: a bad value or a raise is OpenAI's 400 naming the field, and no
    batch is made; a lowering is kept in the batch's metadata as OpenAI keeps any."""
    client = api.client("team-a")
    upload = client.files.create(file=("in.jsonl", _line("x").encode()), purpose="batch")
    refusals = {
        "9": "metadata.llm_batch_priority is 9, above this key's priority 5: a batch may only lower its key's",
        "high": "metadata.llm_batch_priority must be an integer from -100 to 100, got 'high'",
        "-101": "metadata.llm_batch_priority must be an integer from -100 to 100, got '-101'",
    }
    for value, message in refusals.items():
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(
                input_file_id=upload.id, endpoint=CHAT, completion_window="24h", metadata={"llm_batch_priority": value}
            )
        assert refused.value.body["param"] == "metadata.llm_batch_priority"  # type: ignore[index]
        assert refused.value.body["message"] == message  # type: ignore[index]
    assert list(client.batches.list()) == []
    kept = client.batches.create(
        input_file_id=upload.id, endpoint=CHAT, completion_window="24h", metadata={"llm_batch_priority": "5"}
    )
    assert kept.metadata == {"llm_batch_priority": "5"}  # its key's own: allowed (not a raise)
    with pytest.raises(openai.BadRequestError, match="above this key's priority 0"):  # team-b: not listed
        api.batch("team-b", 1, priority="1")


def test_the_queue_orders_by_priority_then_the_end_of_the_window_then_age() -> None:
    """Equal priorities: the window that ends first goes first (a night's is its schedule's day), then the
    oldest; with no priorities set the order is the oldest-first one the queue always had."""

    def batch(name: str, created: int, ends: int, owner: str = "key-team-b") -> BatchRecord:
        return BatchRecord(
            id=name, endpoint=CHAT, model="m", input_file_id="file-x", completion_window="24h", created_at=created,
            expires_at=ends, owner=owner, seq=created, input_key="files/x", output_key=f"batches/{name}/output",
        )  # fmt: skip

    late_window = batch("late-window", 100, 100 + DAY)
    early_window = batch("early-window", 200, 50 + DAY)  # made later, due sooner
    night = NightEntry(id="night-2027-01-15", date="2027-01-15", created_at=150, seq=150)  # due at 150 + a day
    urgent = batch("urgent", 300, 300 + DAY, owner="key-team-a")
    entries = [late_window, night, urgent, early_window]
    order = [entry.id for entry in queue_order(entries, Quotas(priorities=PRIORITIES))]
    assert order == ["urgent", "early-window", "late-window", "night-2027-01-15"]
    same_windows = [batch(f"b{n}", 100 + n, 100 + n + DAY) for n in (3, 1, 2)]
    assert [b.id for b in queue_order(same_windows, Quotas())] == ["b1", "b2", "b3"]


def test_a_batch_that_cannot_finish_in_its_window_is_reported_at_risk_before_it_expires(api: Api) -> None:
    """The rate is measured on the batches that completed (here one: 2 rows in 2 hours, a row an hour, so 24 rows
    fit a window); a batch whose rows, with those ahead of it, pass its window is reported with the rows it is
    short, on the batch (through the official client), in the tick's metric, and in `infra.status --batches`."""
    metrics = QueueMetrics("LLMBatch", "small")
    warm = api.batch("team-b", 2)
    api.service.tick()
    big = api.batch("team-b", 20)  # 20 h at a row an hour: inside its window
    api.service.tick()
    assert _values(metrics.after_tick(api.service))["BatchApiAtRisk"] == 0  # no rate yet: nothing is reported
    api.finish(warm, rows=2, wall_s=2 * 3600.0)  # the rate: 1/3600 rows/s; big starts
    small = api.batch("team-b", 6)  # behind big: 26 rows before its end, 24 fit
    api.service.tick()
    assert api.runs.started == [warm, big]
    report = {"rows_left": 6, "rows_ahead": 20, "rows_short": 2, "rows_per_s": 0.0002778}
    seen = api.client("team-b").batches.retrieve(small)
    assert seen.status == "validating" and Batch.model_validate(seen.model_dump()) == seen  # the SDK keeps it
    found = (seen.model_extra or {})["llm_batch"]["at_risk"]
    assert {k: found[k] for k in report} == report
    assert found["rows_per_s_needed"] == 0.0003009 and found["finishes_at"] == api.service.now() + 26 * 3600
    assert found["as_of"] == api.service.now()
    assert api.service.get_batch("key-team-b", big)["llm_batch"] is None  # running, and it fits
    assert _values(metrics.after_tick(api.service))["BatchApiAtRisk"] == 1

    # A batch of the higher key goes ahead of small (not of the running one): small is shorter still. Within
    # REFRESH_S the standing report is kept; the metric counts at once; the next refresh writes the new figures.
    urgent = api.batch("team-a", 3)
    api.clock.now += 60
    api.service.tick()
    assert api.service.get_batch("key-team-a", urgent)["llm_batch"] is None  # 23 rows before its end
    assert api.service.get_batch("key-team-b", small)["llm_batch"]["at_risk"]["rows_short"] == 2
    api.clock.now += at_risk.REFRESH_S
    api.service.tick()
    refreshed = api.service.get_batch("key-team-b", small)["llm_batch"]["at_risk"]
    # 29 rows before its end, 24 h less 360 s left: ceil(29 - 86040 / 3600) = 6
    assert (refreshed["rows_ahead"], refreshed["rows_short"], refreshed["as_of"]) == (23, 6, api.service.now())

    table = render_batches([_row(api.service.batches.get(small).stored())])  # type: ignore[union-attr]
    assert "AT RISK: 6 rows short of its window (23 ahead, 6 its own; measured 0.0002778 rows/s" in table

    # Closed, a batch carries no report: a cancel of the queued one drops it.
    cancelled = api.client("team-b").batches.cancel(small)
    assert cancelled.status == "cancelled" and (cancelled.model_extra or {})["llm_batch"] is None
    api.service.tick()
    assert _values(metrics.after_tick(api.service))["BatchApiAtRisk"] == 0


def test_the_rate_keeps_the_last_runs_once_each(api: Api) -> None:
    """A finish done twice (a restart between its writes) adds its run once; only the last SAMPLES count."""
    records = api.service.records
    for number in range(at_risk.SAMPLES + 5):
        at_risk.record_run(records, f"batch_{number}", {"rows_in": 10, "wall_s": 1.0})
    at_risk.record_run(records, "batch_24", {"rows_in": 10, "wall_s": 1.0})
    at_risk.record_run(records, "batch_x", {"rows_in": 0, "wall_s": 5.0})  # nothing ran: no sample
    kept = records.get(at_risk.Throughput, at_risk.THROUGHPUT_ID)
    assert kept is not None and [run.batch for run in kept.runs] == [
        f"batch_{n}" for n in range(5, at_risk.SAMPLES + 5)
    ]
    assert at_risk.rate(records) == 10.0


def test_priorities_are_checked_where_they_are_set() -> None:
    """The stack's config, the front's environment and the local server's flag take the same pairs, and each
    bad one stops before any work, naming the setting."""
    from infra.config import StackConfigError, load_stack_config

    assert parse_priorities(" team-a=10, nightly=-5 ,", "--quota-priorities") == {"team-a": 10, "nightly": -5}
    for text, problem in (
        ("team-a", "'team-a' is not NAME=PRIORITY"),
        ("team a=1", "'team a=1' is not NAME=PRIORITY"),
        ("team-a=1,team-a=2", "key 'team-a' is given twice"),
        ("team-a=101", "team-a's priority must be an integer from -100 to 100, got '101'"),
    ):
        with pytest.raises(ValueError, match=problem):
            parse_priorities(text, "LLM_BATCH_QUOTA_PRIORITIES")
    quotas = Quotas(open_batches=3, priorities={"team-a": 10, "nightly": -5})
    assert quotas.env()["LLM_BATCH_QUOTA_PRIORITIES"] == "nightly=-5,team-a=10"
    assert Quotas.from_env(quotas.env()) == quotas
    assert "LLM_BATCH_QUOTA_PRIORITIES" not in Quotas().env()  # none set: unset
    with pytest.raises(ValueError, match="LLM_BATCH_QUOTA_PRIORITIES: 'x' is not NAME=PRIORITY"):
        Quotas.from_env({"LLM_BATCH_QUOTA_PRIORITIES": "x"})
    with pytest.raises(ValidationError, match="priorities: team-a's priority must be from -100 to 100"):
        Quotas(priorities={"team-a": 500})

    parser = argparse.ArgumentParser()
    add_quota_arguments(parser)
    assert quotas_from_args(parser.parse_args(["--quota-priorities", "team-a=3"])).priorities == {"team-a": 3}
    assert quotas_from_args(parser.parse_args([])) == Quotas()
    with pytest.raises(ValueError, match="--quota-priorities: team-a's priority must be"):
        quotas_from_args(parser.parse_args(["--quota-priorities", "team-a="]))

    config = load_stack_config("small", {"cost_center": "cc", "batch_api": {"quotas": {"priorities": {"t": 7}}}})
    assert config.batch_api.quotas.priorities == {"t": 7}
    with pytest.raises(StackConfigError, match=r"llm-batch:batch_api\.quotas\.priorities: .*from -100 to 100"):
        load_stack_config("small", {"cost_center": "cc", "batch_api": {"quotas": {"priorities": {"t": 700}}}})
