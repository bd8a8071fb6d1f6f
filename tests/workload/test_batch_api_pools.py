"""Issue 62: several batches on one engine pool, as the scheduler runs them (workload/batch_api/pools.py).

The real app on a real uvicorn server with the official client, over the service and its scheduler on a real
LocalStore and the test's clock. The job's side is scripted (`PoolRuns`, test_batch_api_metrics.py's Scripted:
it stands in for the rung of a real job, which test_batch_api_e2e.py's pool test climbs with the real engine),
since what is checked here is which batches a run takes, what it hands the job, and how each batch closes while
the others go on. No test waits: the clock is moved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.workload.served_app import ServedApp
from tests.workload.test_batch_api import Clock, _line
from tests.workload.test_batch_api_metrics import Scripted
from workload.auth.keys import ApiKeys, KeySource
from workload.batch_api.app import build_app
from workload.batch_api.executor import BatchRun, RunState
from workload.batch_api.pools import SPEC_SUFFIX, PoolSettings, spec_key
from workload.batch_api.quotas import Quotas
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore

CHAT = "/v1/chat/completions"
KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}


class PoolRuns(Scripted):
    """Scripted, keeping every run the scheduler started (what it hands the job) and every stop it asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[BatchRun] = []
        self.stops: list[str] = []

    def start(self, run: Any) -> None:
        self.runs.append(run)
        self.states[run.batch_id] = RunState("running")

    def stop(self, batch_id: str) -> None:
        self.stops.append(batch_id)
        super().stop(batch_id)


class Api:
    def __init__(self, tmp: Path, pooling: PoolSettings) -> None:
        self.clock, self.executor = Clock(), PoolRuns()
        self.store = LocalStore(tmp / "data")
        quotas = Quotas(priorities={"team-a": 5})
        self.service = BatchService(
            self.store, self.executor, "llm-batch", clock=self.clock, quotas=quotas, pool_settings=pooling
        )
        keys_file = tmp / "keys"
        keys_file.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
        self.served = ServedApp(build_app(self.service, ApiKeys(KeySource(key=None, key_file=keys_file)), "key"))

    def batch(self, team: str, rows: int) -> str:
        client = self.served.client(KEYS[team])
        text = "".join(_line(f"request-{n}") for n in range(rows))  # every batch's ids alike: kept apart by folder
        upload = client.files.create(file=("in.jsonl", text.encode()), purpose="batch")
        return client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h").id

    def status(self, batch_id: str) -> str:
        record = self.service.batches.get(batch_id)
        assert record is not None
        return record.status

    def spec(self, run: BatchRun) -> dict[str, Any]:
        body = self.store.read_blob(spec_key(run.batch_id))
        assert body is not None, run.input_uri
        return dict(json.loads(b"".join(body)))

    def job_finishes(self, batch_id: str, rows: int) -> None:
        """What the job's pool mode leaves in a member's own folder when its last shard commits."""
        output = f"batches/{batch_id}/output"
        lines = "".join(json.dumps({"custom_id": f"request-{n}"}) + "\n" for n in range(rows)).encode()
        self.store.write_blob(f"{output}/output.jsonl", [lines])
        summary = {"rows_in": rows, "input_tokens": rows, "output_tokens": rows, "wall_s": 1.0, "cost_usd": 0.0}
        summary["openai_files"] = {"output_lines": rows, "error_lines": 0}
        self.store.write_blob(f"{output}/summary.json", [json.dumps(summary).encode()])

    def close(self) -> None:
        self.served.stop()
        self.store.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    running = Api(tmp_path, PoolSettings(max_batches=3, join_after_s=60))
    yield running
    running.close()


def test_queued_batches_share_one_run_in_the_queues_order_up_to_the_pools_size(api: Api) -> None:
    """Five queued batches, pools of three: the first run takes the three first in the queue's order (team-a's
    priority first, then the oldest), hands the job each one's own input and output, and the other two wait."""
    b1, b2 = api.batch("team-b", 2), api.batch("team-b", 2)
    a1, a2, b3 = api.batch("team-a", 2), api.batch("team-a", 2), api.batch("team-b", 2)
    api.service.tick()
    (run,) = api.executor.runs
    assert run.batch_id.startswith("pool_") and run.input_uri.endswith(SPEC_SUFFIX)
    spec = api.spec(run)
    assert [m["name"] for m in spec["members"]] == [a1, a2, b1]
    for member in spec["members"]:
        assert member["output"].endswith(f"batches/{member['name']}/output")  # its own folder, as if alone
        assert "/files/" in member["input"]
    assert [api.status(b) for b in (a1, a2, b1, b2, b3)] == ["in_progress"] * 3 + ["validating"] * 2
    assert {api.service.batches.get(b).pool_id for b in (a1, a2, b1)} == {run.batch_id}  # type: ignore[union-attr]


def test_a_batch_its_job_finished_closes_while_the_others_run_on(api: Api) -> None:
    """The small batch's last shard committed (its summary written by the pool job): the tick closes it with its
    own counts, while the large one and the run go on."""
    large, small = api.batch("team-a", 40), api.batch("team-b", 3)
    api.service.tick()
    (run,) = api.executor.runs
    api.job_finishes(small, 3)
    api.service.tick()
    assert api.status(small) == "completed" and api.status(large) == "in_progress"
    closed = api.served.client(KEYS["team-b"]).batches.retrieve(small)
    assert closed.request_counts and closed.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert api.executor.state(run.batch_id).name == "running" and api.executor.stops == []
    api.job_finishes(large, 40)
    api.executor.states[run.batch_id] = RunState("succeeded")
    api.service.tick()
    assert api.status(large) == "completed"
    assert api.store.blob_size(spec_key(run.batch_id)) is None  # the pool's spec and notes go with its run
    assert api.store.list_blobs(f"batches/{run.batch_id}/output") == []


def test_a_cancel_of_one_stops_the_run_and_the_other_runs_again_without_it(api: Api) -> None:
    """A cancel stops the pool's job whole (SIGTERM: each batch keeps its commits); the cancelled batch closes
    with its error file, and the other starts again at once, alone now, on its own output (it resumes)."""
    large, small = api.batch("team-a", 6), api.batch("team-b", 2)
    api.service.tick()
    (pool,) = api.executor.runs
    api.served.client(KEYS["team-b"]).batches.cancel(small)
    assert api.executor.stops == [pool.batch_id]
    api.service.tick()
    assert api.status(small) == "cancelled" and api.status(large) == "in_progress"
    rerun = api.executor.runs[-1]
    assert rerun.batch_id == large and rerun.output_uri.endswith(f"batches/{large}/output")
    assert api.service.batches.get(large).pool_id is None  # type: ignore[union-attr]
    errors = api.served.client(KEYS["team-b"]).batches.retrieve(small).error_file_id
    assert errors is not None  # one batch_cancelled line per request the run never answered


def test_a_queued_batch_joins_the_running_one_at_the_next_run(api: Api) -> None:
    """A batch created while another runs waits until the run has had `join_after_s`; then the tick stops the
    run and starts the next with both, the running batch first."""
    large = api.batch("team-b", 40)
    api.service.tick()
    assert [r.batch_id for r in api.executor.runs] == [large]
    small = api.batch("team-a", 2)
    api.clock.now += 30
    api.service.tick()
    assert api.executor.stops == [] and api.status(small) == "validating"
    api.clock.now += 30
    api.service.tick()  # the run stops (its job commits what finished) ...
    assert api.executor.stops == [large]
    api.service.tick()  # ... and the next takes both
    joined = api.executor.runs[-1]
    assert [m["name"] for m in api.spec(joined)["members"]] == [large, small]
    assert api.status(small) == "in_progress"


def test_a_batch_the_pool_refused_fails_with_the_jobs_reason(api: Api) -> None:
    """The pool job refused one batch (its `_failed.json`) and finished the other: the refused one fails naming
    why, the other completes."""
    first, second = api.batch("team-a", 2), api.batch("team-a", 2)
    api.service.tick()
    (run,) = api.executor.runs
    note = {"reason": "OutputMismatchError: changed since it was made: in.jsonl"}
    api.store.write_blob(f"batches/{second}/output/_failed.json", [json.dumps(note).encode()])
    api.job_finishes(first, 2)
    api.executor.states[run.batch_id] = RunState("succeeded")
    api.service.tick()
    assert api.status(first) == "completed" and api.status(second) == "failed"
    failed = api.served.client(KEYS["team-a"]).batches.retrieve(second)
    assert failed.errors and failed.errors.data
    (error,) = failed.errors.data
    assert error.code == "job_failed" and "OutputMismatchError" in str(error.message)


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batches must be at least 1"):
        PoolSettings(max_batches=0)
    with pytest.raises(ValueError, match="join_after_s must be at least 0"):
        PoolSettings(join_after_s=-1)
    assert PoolSettings().max_batches == 1  # a service made without settings runs each batch alone


def test_the_official_client_reads_a_pooled_batch(api: Api) -> None:
    """The private fields a pool adds (`_pool`, `_run_since`) never reach a client."""
    batch_id = api.batch("team-a", 1)
    api.batch("team-a", 1)
    api.service.tick()
    fetched = api.served.client(KEYS["team-a"]).batches.retrieve(batch_id)
    assert isinstance(fetched, openai.types.Batch)
    assert not any(key.startswith("_") for key in fetched.model_dump())
