"""The Batch API's per-batch cost field and its queue metrics (workload/batch_api/queue_metrics.py): the service
and its scheduler on a real LocalStore, on the test's clock, with the job's side scripted (see Scripted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types import Batch

from tests.workload.test_batch_api import Clock, _line
from workload.batch_api.executor import RunState
from workload.batch_api.models import BatchRecord
from workload.batch_api.objects import GPU_SHARE_BASIS, SIDE_FIELD
from workload.batch_api.queue_metrics import QueueMetrics
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore
from workload.contract import metric_names as mn

METRICS = QueueMetrics("LLMBatch", "small")


class Scripted:
    """Stands in for the tiers' executor (StepFunctionsExecutor, run against moto in test_batch_api_sfn.py): the
    test sets how each batch's run stands, and writes what the job writes (test_batch_api_e2e.py runs the job)."""

    def __init__(self) -> None:
        self.states: dict[str, RunState] = {}

    def start(self, run: Any) -> None:
        self.states.setdefault(run.batch_id, RunState("running"))

    def state(self, batch_id: str) -> RunState:
        return self.states.get(batch_id, RunState("absent"))

    def occupied(self) -> bool:
        return False  # every run here is one the scheduler started and follows

    def stop(self, batch_id: str) -> None:
        self.states[batch_id] = RunState("stopped")

    def chain(self) -> None:
        return None  # no execution here takes the next run itself


def _values(line: str | None) -> dict[str, int]:
    """The metrics of one EMF line, checked against the format's directive (every value named in it)."""
    assert line is not None
    document = json.loads(line)
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "LLMBatch" and directive["Dimensions"] == [[mn.DIM_STACK]]
    assert document[mn.DIM_STACK] == "small" and isinstance(document["_aws"]["Timestamp"], int)
    names = [metric["Name"] for metric in directive["Metrics"]]
    assert all(metric["Unit"] == "Count" for metric in directive["Metrics"])
    return {name: document[name] for name in names}


def _job_finishes(service: BatchService, batch_id: str, wall_s: float, cost_usd: float) -> None:
    """What the job leaves in a batch's output folder when it ends (workload/job/output.py's layout)."""
    output = f"batches/{batch_id}/output"
    service.store.write_blob(f"{output}/output.jsonl", [b'{"custom_id": "a"}\n{"custom_id": "b"}\n'])
    summary = {"rows_in": 2, "input_tokens": 20, "output_tokens": 8, "wall_s": wall_s, "cost_usd": cost_usd}
    service.store.write_blob(f"{output}/summary.json", [json.dumps(summary).encode()])


@pytest.fixture
def service(tmp_path: Path) -> Any:
    store = LocalStore(tmp_path / "data")
    yield BatchService(store, Scripted(), "llm-batch", clock=Clock())
    store.close()


def test_a_nights_queue_counts_each_close_once_and_prices_each_batch(service: BatchService) -> None:
    executor: Scripted = service.executor  # type: ignore[assignment]
    two = service.upload_file("p", "in.jsonl", "batch", [(_line("a") + _line("b")).encode()])["id"]
    empty = service.upload_file("p", "empty.jsonl", "batch", [b"\n"])["id"]
    first, second = (service.create_batch("p", two, "/v1/chat/completions", "24h")["id"] for _ in "ab")
    assert service.create_batch("p", empty, "/v1/chat/completions", "24h")["status"] == "failed"
    assert _values(METRICS.after_request(service)) == {"BatchApiFailed": 1}  # the request that made it failed
    assert METRICS.after_request(service) is None  # taken: a request that closes nothing prints nothing

    service.tick()
    assert _values(METRICS.after_tick(service)) == {
        "BatchApiQueued": 1, "BatchApiRunning": 1, "BatchApiFailed": 0, "BatchApiExpired": 0,
        "BatchApiAtRisk": 0,
    }  # fmt: skip
    assert service.get_batch("p", first)[SIDE_FIELD] is None  # open: no share yet

    _job_finishes(service, first, wall_s=812.5, cost_usd=0.2274)
    executor.states[first] = RunState("succeeded")
    service.tick()  # the first completes; the second starts on the same GPUs
    done = service.get_batch("p", first)
    assert done["status"] == "completed"
    assert done[SIDE_FIELD] == {"job_wall_s": 812.5, "cost_usd": 0.2274, "basis": GPU_SHARE_BASIS}
    # The official client's Batch keeps the side field (its model allows extras), beside OpenAI's own fields.
    parsed = Batch.model_validate(done)
    assert parsed.status == "completed" and parsed.model_extra == {SIDE_FIELD: done[SIDE_FIELD]}
    assert _values(METRICS.after_tick(service))["BatchApiRunning"] == 1

    executor.states[second] = RunState("failed", "JobFailed: CUDA out of memory")
    service.tick()
    failed = service.get_batch("p", second)
    assert failed["status"] == "failed" and failed[SIDE_FIELD] is None  # no summary: nothing ran to its end
    assert _values(METRICS.after_tick(service)) == {
        "BatchApiQueued": 0, "BatchApiRunning": 0, "BatchApiFailed": 1, "BatchApiExpired": 0,
        "BatchApiAtRisk": 0,
    }  # fmt: skip

    # Two more: the first's run is refused while another run holds the GPUs, the second waits behind it.
    held, waiting = (service.create_batch("p", two, "/v1/chat/completions", "24h")["id"] for _ in "ab")
    executor.states[held] = RunState("busy", "another run holds the GPUs")
    service.tick()
    assert _values(METRICS.after_tick(service))["BatchApiQueued"] == 1
    service.clock.now += 24 * 3600  # type: ignore[attr-defined]
    service.tick()  # both windows are over: one expires running (stopped), the other queued
    assert [service.get_batch("p", b)["status"] for b in (held, waiting)] == ["expired", "expired"]
    assert _values(METRICS.after_tick(service)) == {
        "BatchApiQueued": 0, "BatchApiRunning": 0, "BatchApiFailed": 0, "BatchApiExpired": 2,
        "BatchApiAtRisk": 0,
    }  # fmt: skip
    service.tick()
    counted = _values(METRICS.after_tick(service))
    assert (counted["BatchApiFailed"], counted["BatchApiExpired"]) == (0, 0)  # the next tick does not count them


def test_two_fronts_racing_to_close_one_batch_count_it_once(service: BatchService) -> None:
    """The tick and another front close the same batch between the tick's read and its write: the tick's write
    loses the compare-and-swap, its redo finds the batch closed, and only the winner counts it."""
    other = BatchService(service.store, Scripted(), "llm-batch", clock=service.clock)
    file_id = service.upload_file("p", "in.jsonl", "batch", [_line("a").encode()])["id"]
    batch_id = service.create_batch("p", file_id, "/v1/chat/completions", "24h")["id"]
    tries = []

    def closed_by_the_other(record: BatchRecord) -> None:
        record.status, record.done_at = "expired", 1

    def expire(record: BatchRecord) -> None:
        if not tries:  # the other front writes first, after this try read the record
            other.batches.update(batch_id, closed_by_the_other)
        tries.append(record.status)
        if record.status == "validating":
            record.status, record.done_at = "expired", 2

    service.batches.update(batch_id, expire)
    assert tries == ["validating", "expired"]  # the first try lost its race; the redo saw the batch closed
    assert (service.take_closed(), other.take_closed()) == ({}, {"expired": 1})


def test_a_namespace_of_aws_or_no_stack_is_refused() -> None:
    with pytest.raises(ValueError, match="AWS/ is AWS's own"):
        QueueMetrics("AWS/Lambda", "small")
    with pytest.raises(ValueError, match="the stack's name"):
        QueueMetrics("LLMBatch", "")


class _ReadsNoted(LocalStore):
    """The real LocalStore, noting the key of every body it reads (which of the job's files a close opens)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.read: list[str] = []

    def read_blob(self, key: str) -> Any:
        self.read.append(key)
        return super().read_blob(key)


def test_a_finished_batchs_close_takes_its_line_counts_from_the_summary(tmp_path: Path) -> None:
    """Found in issue 50: closing a batch read output.jsonl and errors.jsonl whole to count lines that the job's
    summary.json already holds. A finished job's summary counts them (workload/job/attempt.py); the close reads
    only the summary. A stopped job's partial files have no summary: those are still counted (test_batch_api_e2e)."""
    store = _ReadsNoted(tmp_path / "data")
    service = BatchService(store, Scripted(), "llm-batch", clock=Clock())
    try:
        three = service.upload_file("p", "in.jsonl", "batch", [(_line("a") + _line("b") + _line("c")).encode()])
        batch = service.create_batch("p", three["id"], "/v1/chat/completions", "24h")["id"]
        service.tick()
        output = f"batches/{batch}/output"
        store.write_blob(f"{output}/output.jsonl", [b'{"custom_id": "a"}\n{"custom_id": "b"}\n'])
        store.write_blob(f"{output}/errors.jsonl", [b'{"custom_id": "c"}\n'])
        summary = {"rows_in": 3, "input_tokens": 9, "cached_tokens": 5, "output_tokens": 4, "wall_s": 1.0}
        summary["reasoning_tokens"] = 3
        summary["cost_usd"] = 0.001
        store.write_blob(
            f"{output}/summary.json",
            [json.dumps({**summary, "openai_files": {"output_lines": 2, "error_lines": 1}}).encode()],
        )
        service.executor.states[batch] = RunState("succeeded")  # type: ignore[attr-defined]
        store.read.clear()
        service.tick()
        done = service.get_batch("p", batch)
        assert done["status"] == "completed" and done["output_file_id"] and done["error_file_id"]
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        assert not [key for key in store.read if key.endswith(("output.jsonl", "errors.jsonl"))], store.read
        usage = Batch.model_validate(done).usage  # prefix-cache hits and thinking, as the job summed them (issue 55)
        assert usage is not None and usage.input_tokens_details.cached_tokens == 5 and usage.input_tokens == 9
        assert usage.output_tokens_details.reasoning_tokens == 3
    finally:
        store.close()
