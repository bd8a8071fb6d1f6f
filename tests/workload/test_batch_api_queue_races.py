"""The queue on the tiers, exactly once (issue 59): overlapping ticks, a hand-over that fails after its claim, a
night whose start fails, a cancel that waits for the job's partial files, expiry judged by when a batch finished,
and a queued batch's input kept until it runs.

The tiers' executor runs against moto's Step Functions and S3 (the state machine a Wait, or moto running a Pass
machine, where the test needs an execution that ended); failures on the wire go through the suite's lost-reply
proxy (tests/lost_reply.py), which loses a request or its reply, as a connection reset does.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from tests.infra.nightly_aws import executing_state_machines, wait_for
from tests.lost_reply import LostReplyProxy
from tests.workload.test_batch_api import Clock, _line
from tests.workload.test_batch_api_metrics import Scripted
from tests.workload.test_batch_api_sfn import _machine
from workload.batch_api.executor import RunState
from workload.batch_api.models import NightEntry
from workload.batch_api.objects import Limits
from workload.batch_api.s3_store import S3Store
from workload.batch_api.service import BatchService
from workload.batch_api.sfn_executor import StepFunctionsExecutor
from workload.batch_api.store import LocalStore

WAITS = {"StartAt": "Run", "States": {"Run": {"Type": "Wait", "Seconds": 86400, "End": True}}}
PASSES = {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}
CHAT = "/v1/chat/completions"
SUMMARY = b'{"rows_in": 1, "input_tokens": 1, "output_tokens": 1}'  # what the job writes last
ONCE = Config(retries={"mode": "standard", "total_max_attempts": 1})  # a failure on the wire reaches the caller at once


@pytest.fixture
def bucket(moto_endpoint: str) -> Iterator[str]:
    name = f"races-{secrets.token_hex(4)}"
    boto3.client("s3").create_bucket(Bucket=name)
    yield name


def _running(machine: str) -> list[dict[str, Any]]:
    return list(
        boto3.client("stepfunctions").list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]
    )


class _ListTogether:
    """The real moto Step Functions client, but each tick waits after listing the executions until the other tick
    has listed too: the overlap that two tick invocations in the same minute have (3 of 3 runs in the review),
    made certain instead of left to timing. Nothing is answered for moto."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.sfn, self.barrier = boto3.client("stepfunctions"), barrier

    def get_paginator(self, name: str) -> Any:
        real = self.sfn.get_paginator(name)
        barrier = self.barrier

        class Listing:
            def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
                pages = list(real.paginate(**kwargs))
                with contextlib.suppress(threading.BrokenBarrierError):  # the other tick listed less: go on alone
                    barrier.wait(timeout=5)
                return pages

        return Listing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sfn, name)


def test_overlapping_ticks_start_one_execution(bucket: str) -> None:
    """Finding 5: two ticks that both saw no execution start one between them; the other batch waits (`busy`)
    and starts once the GPUs are free."""
    machine, barrier = _machine(WAITS), threading.Barrier(2)
    store = S3Store(boto3.client("s3"), bucket)
    services = [
        BatchService(store, StepFunctionsExecutor(_ListTogether(barrier), store, machine), "llm-batch", clock=Clock())
        for _ in range(2)
    ]
    file_id = services[0].upload_file("p", "a.jsonl", "batch", [_line("a").encode()])["id"]
    first, second = (services[0].create_batch("p", file_id, CHAT, "24h")["id"] for _ in "ab")
    ticks = [threading.Thread(target=service.tick) for service in services]
    for tick in ticks:
        tick.start()
    for tick in ticks:
        tick.join(timeout=60)
    barrier.abort()  # the overlap is over: later ticks list alone
    (running,) = _running(machine)  # one execution on the GPU group, not two
    states = {b: services[0].get_batch("p", b)["status"] for b in (first, second)}
    assert sorted(states.values()) in (["in_progress", "in_progress"], ["in_progress", "validating"]), states
    boto3.client("stepfunctions").stop_execution(executionArn=running["executionArn"])
    store.write_blob(f"batches/{running['name'].rsplit('-', 1)[0]}/output/summary.json", [SUMMARY])
    for _ in range(2):  # the one that ran closes; the other starts now that the GPUs are free
        services[0].tick()
    (after,) = _running(machine)
    assert after["executionArn"] != running["executionArn"]


@pytest.mark.parametrize("fails", ["answer", "batch-marker", "turn"])
def test_a_hand_over_that_fails_after_its_claim_leaves_the_batch_to_run(
    lost_reply: LostReplyProxy, bucket: str, fails: str
) -> None:
    """Finding 4, retried: NextBatch claims B, then fails on a store write (a connection reset on the way to S3)
    and is retried with the same `asked`. B is never failed unrun: a retry after the answer was remembered hands
    the same B over (C stays queued), and a B left with no execution runs once the one holding the GPUs ends."""
    machine = _machine(WAITS)
    sfn = boto3.client("stepfunctions")
    store = S3Store(boto3.client("s3", endpoint_url=lost_reply.url, config=ONCE), bucket)
    executor = StepFunctionsExecutor(sfn, store, machine)
    service = BatchService(store, executor, "llm-batch", clock=Clock())
    file_id = service.upload_file("p", "a.jsonl", "batch", [_line("a").encode()])["id"]
    a, b, c = (service.create_batch("p", file_id, CHAT, "24h")["id"] for _ in "abc")
    service.tick()
    (execution,) = _running(machine)
    arn = execution["executionArn"]
    store.write_blob(f"batches/{a}/output/summary.json", [SUMMARY])
    if fails == "batch-marker":  # the hand-over's first write
        lost_reply.lose("PUT", f"/batches/{b}/execution.json", forward=False)
    else:  # the execution's marker, written when its polls are counted, with the answer, then at the hand-over
        lost_reply.lose("PUT", "/executions/", after=1 if fails == "answer" else 2, forward=False)
    asked = "2026-12-06T01:00:00.000Z"
    with pytest.raises(botocore.exceptions.BotoCoreError):
        service.next_run(arn, polls=3, max_polls=30, poll_budget=100, asked=asked)
    assert lost_reply.armed() == 0
    if fails == "turn":  # a tick between the hand-over's two writes: B is handed over, not yet the current run
        service.tick()
        assert service.get_batch("p", b)["status"] == "in_progress" and executor.state(b).name == "running"
    retried = service.next_run(arn, polls=3, max_polls=30, poll_budget=100, asked=asked)
    if fails != "answer":
        assert retried["run"]["batch"]["id"] == b, retried  # the same run, on the same boot
        assert service.get_batch("p", c)["status"] == "validating"
    service.tick()
    assert service.get_batch("p", b)["status"] == "in_progress", (retried, executor.state(b))
    if retried["run"]["batch"]["id"] == b:
        assert executor.state(b).name == "running"
        return
    # C was handed over instead: B waits for the GPUs (busy), and starts on an execution of its own once they
    # are free (C, stopped with them, resumes the same way: one of the two first, one execution at a time).
    assert executor.state(b).name == "busy"
    sfn.stop_execution(executionArn=arn)
    for _ in range(6):
        service.tick()
        if any(e["name"].startswith(f"{b}-") for e in _running(machine)):
            break
        for execution in _running(machine):  # C's run ends: the GPUs go to B
            store.write_blob(f"batches/{c}/output/summary.json", [SUMMARY])
            sfn.stop_execution(executionArn=execution["executionArn"])
    (again,) = _running(machine)
    assert again["name"].startswith(f"{b}-") and executor.state(b).name == "running", again
    assert service.get_batch("p", b)["status"] == "in_progress"


def test_a_hand_over_whose_execution_ended_without_it_runs_again(bucket: str, moto_endpoint: str) -> None:
    """Finding 4, caught: the execution ended (its NextBatch's answer lost, the machine's catch released the
    GPUs) after B was handed to it; B never ran, so it starts again instead of failing."""
    store = S3Store(boto3.client("s3"), bucket)
    sfn = boto3.client("stepfunctions")
    with executing_state_machines(moto_endpoint):
        machine = _machine(PASSES)
        executor = StepFunctionsExecutor(sfn, store, machine)
        service = BatchService(store, executor, "llm-batch", clock=Clock())
        file_id = service.upload_file("p", "a.jsonl", "batch", [_line("a").encode()])["id"]
        a, b = (service.create_batch("p", file_id, CHAT, "24h")["id"] for _ in "ab")
        service.tick()
        (first,) = sfn.list_executions(stateMachineArn=machine)["executions"]
        store.write_blob(f"batches/{a}/output/summary.json", [SUMMARY])
        handed = service.next_run(first["executionArn"], polls=3, max_polls=30, poll_budget=100)
        assert handed["run"]["batch"]["id"] == b
        wait_for(lambda: sfn.describe_execution(executionArn=first["executionArn"])["status"] == "SUCCEEDED")
        service.tick()
        assert service.get_batch("p", b)["status"] == "in_progress", executor.state(b)
        names = [e["name"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]]
        assert any(name.startswith(f"{b}-") for name in names), names  # started again, on its own execution


@pytest.mark.parametrize("forward", [False, True], ids=["start-lost", "reply-lost"])
def test_a_night_whose_start_failed_is_not_stranded(lost_reply: LostReplyProxy, bucket: str, forward: bool) -> None:
    """Finding 3: the night is claimed, then its StartExecution is lost on the wire (never applied) or its reply
    is (applied); past START_S the tick queues it again and starts it, or records the execution it has."""
    machine = _machine(WAITS)
    store = S3Store(boto3.client("s3"), bucket)
    sfn = boto3.client("stepfunctions", endpoint_url=lost_reply.url, config=ONCE)
    clock = Clock()
    # One clock for both: the failed start holds the GPU slot (SLOT_START_S) as long as the claim waits (START_S).
    executor = StepFunctionsExecutor(sfn, store, machine, clock=clock)
    service = BatchService(store, executor, "llm-batch", clock=clock)
    service.enqueue_night("2026-12-06T01:00:00Z")
    lost_reply.lose("POST", "/", header="X-Amz-Target", value="AWSStepFunctions.StartExecution", forward=forward)
    with pytest.raises(botocore.exceptions.BotoCoreError):
        service.tick()
    assert lost_reply.armed() == 0
    clock.now += 121
    service.tick()
    (running,) = _running(machine)
    assert json.loads(
        boto3.client("stepfunctions").describe_execution(executionArn=running["executionArn"])["input"]
    ) == {"date": "2026-12-06"}
    entry = service.records.get(NightEntry, "night-2026-12-06")
    assert entry is not None and entry.status == "started" and entry.execution_arn == running["executionArn"]


def test_a_cancel_on_the_tiers_waits_for_the_jobs_partial_files(bucket: str) -> None:
    """Finding 6: the execution is ABORTED before the node's SIGTERM makes the job write its files; the batch
    closes `cancelled` once they are there (the job's `_interrupted.json`, written after them), with them."""
    machine = _machine(WAITS)
    store = S3Store(boto3.client("s3"), bucket)
    executor = StepFunctionsExecutor(boto3.client("stepfunctions"), store, machine)
    service = BatchService(store, executor, "llm-batch", clock=Clock())
    file_id = service.upload_file("p", "a.jsonl", "batch", [(_line("a") + _line("b")).encode()])["id"]
    batch = service.create_batch("p", file_id, CHAT, "24h")["id"]
    service.tick()
    output = f"batches/{batch}/output"
    store.write_blob(f"{output}/_manifest.json", [b"{}"])  # the job is running on it
    assert service.cancel_batch("p", batch)["status"] == "cancelling"
    service.tick()
    assert service.get_batch("p", batch)["status"] == "cancelling"  # ABORTED, the job still committing
    answer = {"custom_id": "a", "response": {"status_code": 200, "body": {}}, "error": None}
    store.write_blob(f"{output}/output.jsonl", [(json.dumps(answer) + "\n").encode()])
    store.write_blob(f"{output}/errors.jsonl", [b""])
    store.write_blob(f"{output}/_interrupted.json", [b'{"reason": "SIGTERM"}'])
    service.tick()
    closed = service.get_batch("p", batch)
    assert closed["status"] == "cancelled" and closed["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    answers = [json.loads(line) for line in b"".join(service.file_content("p", closed["output_file_id"])).splitlines()]
    unrun = [json.loads(line) for line in b"".join(service.file_content("p", closed["error_file_id"])).splitlines()]
    assert [a["custom_id"] for a in answers] == ["a"]
    assert [(e["custom_id"], e["error"]["code"]) for e in unrun] == [("b", "batch_cancelled")]


def test_a_stopped_job_that_writes_nothing_closes_after_its_bound(bucket: str) -> None:
    """Finding 6, bounded: a job that never writes its files (its node gone at once) does not hold the batch
    open past its stop's bound (`stop_wait_s`)."""
    machine = _machine(WAITS)
    store = S3Store(boto3.client("s3"), bucket)
    later = [0.0]
    executor = StepFunctionsExecutor(
        boto3.client("stepfunctions"), store, machine, clock=lambda: datetime.now(UTC).timestamp() + later[0]
    )
    service = BatchService(store, executor, "llm-batch", clock=Clock())
    file_id = service.upload_file("p", "a.jsonl", "batch", [_line("a").encode()])["id"]
    batch = service.create_batch("p", file_id, CHAT, "24h")["id"]
    service.tick()
    store.write_blob(f"batches/{batch}/output/_manifest.json", [b"{}"])
    service.cancel_batch("p", batch)
    service.tick()
    assert service.get_batch("p", batch)["status"] == "cancelling"
    later[0] = executor.stop_wait_s + 1
    service.tick()
    assert service.get_batch("p", batch)["status"] == "cancelled"


def test_expiry_is_judged_by_when_the_batch_finished(tmp_path: Any) -> None:
    """Finding 7: a batch whose job finished 30 s before `expires_at`, ticked after it, is `completed`."""
    clock, executor = Clock(), Scripted()
    store = LocalStore(tmp_path / "data")
    service = BatchService(store, executor, "llm-batch", Limits(), clock)
    file_id = service.upload_file("p", "a.jsonl", "batch", [_line("a").encode()])["id"]
    batch = service.create_batch("p", file_id, CHAT, "24h")
    service.tick()
    finished = datetime.fromtimestamp(batch["expires_at"] - 30, UTC).isoformat(timespec="milliseconds")
    summary = {"rows_in": 1, "input_tokens": 3, "output_tokens": 2, "finished_at": finished}
    output = f"batches/{batch['id']}/output"
    store.write_blob(f"{output}/summary.json", [json.dumps(summary).encode()])
    store.write_blob(f"{output}/output.jsonl", [b'{"custom_id": "a"}\n'])
    executor.states[batch["id"]] = RunState("succeeded")
    clock.now = batch["expires_at"] + 60  # the tick comes late
    service.tick()
    assert service.get_batch("p", batch["id"])["status"] == "completed"
    store.close()


def test_a_queued_batchs_input_is_kept_until_it_runs(tmp_path: Any) -> None:
    """Finding 7: an input File with `expires_after` outlives its expiry while its batch waits in the queue, and
    goes once the batch has run."""
    clock, executor = Clock(), Scripted()
    store = LocalStore(tmp_path / "data")
    service = BatchService(store, executor, "llm-batch", Limits(), clock)
    first_file = service.upload_file("p", "a.jsonl", "batch", [_line("a").encode()])["id"]
    short = service.upload_file("p", "b.jsonl", "batch", [_line("b").encode()], expires_after_s=3600)["id"]
    first = service.create_batch("p", first_file, CHAT, "24h")["id"]
    waiting = service.create_batch("p", short, CHAT, "24h")["id"]
    service.tick()  # the first runs; the second waits past its file's expiry
    clock.now += 3600
    service.tick()
    assert service.get_file("p", short)["id"] == short
    store.write_blob(f"batches/{first}/output/summary.json", [SUMMARY])
    executor.states[first] = RunState("succeeded")
    service.tick()  # the first closes
    service.tick()  # the second starts, its input there
    assert service.get_batch("p", waiting)["status"] == "in_progress"
    executor.states[waiting] = RunState("failed", "done with it")
    service.tick()
    service.tick()
    assert [f["id"] for f in service.list_files("p", None, 100, "asc", None)["data"]] == [first_file]
    store.close()
