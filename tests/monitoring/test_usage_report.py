"""Usage and cost per key per day (issue 63): batches driven through the Batch API's own service on its S3Store
(moto's S3, as the deployed functions write it), read back by the daily cost report and `python -m infra.usage`,
and one day's usage by key reconciled against a bill injected into moto's Cost Explorer
(`/moto-api/static/ce/cost-and-usage-results`).

The job's side is scripted (test_batch_api_metrics.py's Scripted, writing each batch's summary.json as the job
does, a pooled batch's with its share of the pool's time) and so is the execution's: `Chained` writes the
markers StepFunctionsExecutor writes (`batches/<run>/execution.json`, `executions/<name>.json`), and `Described`
answers DescribeExecution with the test clock's dates, which moto's Step Functions cannot (its executions carry
the wall clock's start and stop). No engine starts and no test waits: the clock is moved.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.ops import usage as usage_tool
from infra.ops.status_batches import list_batches, render_batches
from monitoring.cost_report import handler as cost_report
from monitoring.cost_report import usage as batch_usage
from tests.monitoring.test_cost_report import _load_ce_results, _page, _received, topic_and_queue
from tests.workload.test_batch_api import Clock, _line
from tests.workload.test_batch_api_metrics import Scripted
from workload.batch_api.executor import RunState
from workload.batch_api.pools import PoolSettings
from workload.batch_api.s3_store import S3Store
from workload.batch_api.service import BatchService

__all__ = ["topic_and_queue"]  # the fixture, shared with test_cost_report.py

BUCKET = "llm-batch-small-data"
ARN = "arn:aws:states:us-east-1:123456789012:execution:llm-batch-small-nightly:exec-1"
PRICE = 0.43  # a g5.xlarge's Spot price an hour, the small stack's
T0 = 1_800_000_000  # the test clock's start: 2027-01-15 08:00 UTC
DAY = date(2027, 1, 15)


class Chained(Scripted):
    """Scripted, writing the markers StepFunctionsExecutor writes when a run starts on the execution ARN."""

    def __init__(self, store: S3Store) -> None:
        super().__init__()
        self.store = store

    def close(self) -> None:
        """Nothing runs here to close."""

    def start(self, run: Any) -> None:
        super().start(run)
        self.store.write_blob(f"batches/{run.batch_id}/execution.json", [json.dumps({"execution_arn": ARN}).encode()])
        key = "executions/exec-1.json"
        body = self.store.read_blob(key)
        spent = json.loads(b"".join(body)) if body is not None else {"polls": 0, "runs": 0}
        self.store.write_blob(key, [json.dumps({**spent, "current": run.batch_id, "runs": spent["runs"] + 1}).encode()])


class Described:
    """DescribeExecution of the one execution, started and stopped when the test says."""

    class exceptions:  # boto3 names it so
        ExecutionDoesNotExist = KeyError

    def __init__(self) -> None:
        self.stopped: float | None = None

    def describe_execution(self, executionArn: str) -> dict[str, Any]:  # boto3 names the argument so
        assert executionArn == ARN
        found: dict[str, Any] = {"status": "RUNNING", "startDate": datetime.fromtimestamp(T0, UTC)}
        if self.stopped is not None:
            found.update(status="SUCCEEDED", stopDate=datetime.fromtimestamp(self.stopped, UTC))
        return found


def _job_finishes(
    store: S3Store, batch_id: str, wall_s: float, tokens: tuple[int, int, int, int], pooled: bool
) -> None:
    """What the job leaves in a batch's output: its answers and summary.json (workload/job/summary.py's fields)."""
    output = f"batches/{batch_id}/output"
    store.write_blob(f"{output}/output.jsonl", [b'{"custom_id": "a"}\n{"custom_id": "b"}\n'])
    inputs, cached, outputs, reasoning = tokens
    summary: dict[str, Any] = {
        "rows_in": 2,
        "input_tokens": inputs,
        "cached_tokens": cached,
        "output_tokens": outputs,
        "reasoning_tokens": reasoning,
        "wall_s": wall_s,
        "cost_usd": round(PRICE * wall_s / 3600, 4),
        "finished_at": datetime.fromtimestamp(T0 + 3000, UTC).isoformat(),
    }
    if pooled:
        summary["share_basis"] = "tokens"  # workload/job/pool.py: a member's share of the pool's time
    store.write_blob(f"{output}/summary.json", [json.dumps(summary).encode()])


@pytest.fixture
def a_day(moto_reset: str) -> tuple[S3Store, Described, dict[str, str]]:
    """One execution on 2027-01-15: boot 300 s, team-a's batch alone (600 s of job), a hand-over of 60 s, a pool of
    team-b's and team-a's (300 s and 100 s of its 400 s), 200 s of hold, and a night's run counted in its marker;
    beside it, a batch failed at create (no run)."""
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    store = S3Store(boto3.client("s3"), BUCKET)
    clock, executor, described = Clock(), Chained(store), Described()
    clock.now = T0
    service = BatchService(store, executor, "llm-batch", clock=clock, pool_settings=PoolSettings(max_batches=2))
    two = (_line("a") + _line("b")).encode()
    files = {owner: service.upload_file(owner, "in.jsonl", "batch", [two])["id"] for owner in ("team-a", "team-b")}
    ids = {"alone": service.create_batch("team-a", files["team-a"], "/v1/chat/completions", "24h")["id"]}
    clock.now = T0 + 300
    service.tick()  # boot over: the first batch starts alone
    ids["b"] = service.create_batch("team-b", files["team-b"], "/v1/chat/completions", "24h")["id"]
    ids["a2"] = service.create_batch("team-a", files["team-a"], "/v1/chat/completions", "24h")["id"]
    clock.now = T0 + 900
    _job_finishes(store, ids["alone"], 600, (40, 10, 30, 5), pooled=False)
    executor.states[ids["alone"]] = RunState("succeeded")
    service.tick()  # it closes; the two queued batches start as one pool
    (pool_id,) = [run for run in executor.states if run.startswith("pool_")]
    clock.now = T0 + 1360
    _job_finishes(store, ids["b"], 300, (30, 0, 60, 0), pooled=True)
    _job_finishes(store, ids["a2"], 100, (10, 0, 20, 0), pooled=True)
    executor.states[pool_id] = RunState("succeeded")
    service.tick()
    service.tick()  # a second tick closes nothing again
    described.stopped = T0 + 1560
    empty = service.upload_file("team-b", "empty.jsonl", "batch", [b"\n"])["id"]
    ids["failed"] = service.create_batch("team-b", empty, "/v1/chat/completions", "24h")["id"]
    spent = json.loads(b"".join(store.read_blob("executions/exec-1.json") or []))
    store.write_blob("executions/exec-1.json", [json.dumps({**spent, "runs": spent["runs"] + 1}).encode()])  # a night
    return store, described, ids


def test_a_days_usage_per_batch_and_key_includes_the_boot_and_hold(
    a_day: tuple[S3Store, Described, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, described, ids = a_day
    reader = batch_usage.BucketReader(boto3.client("s3"), BUCKET, described)
    usage = batch_usage.read_day(reader, DAY)

    rows = {row.id: row for row in usage.batches}
    assert set(rows) == set(ids.values())  # each closed batch once (done markers of the day, one listing)
    # Held 1,560 s, of which 1,000 s were jobs: the 560 s of boot, hand-over and hold go by job time.
    shares = {name: (rows[i].job_gpu_s, rows[i].boot_hold_gpu_s) for name, i in ids.items()}
    assert shares == {"alone": (600, 336), "b": (300, 168), "a2": (100, 56), "failed": (0, 0)}
    assert rows[ids["alone"]].boot_hold_cost_usd == pytest.approx(336 * PRICE / 3600, rel=1e-3)
    (execution,) = usage.executions
    assert (execution.held_s, execution.job_s, execution.boot_hold_s) == (1560, 1000, 560)
    assert execution.runs == 3 and execution.runs_unmatched == 1  # the night's run: no batch of it
    assert execution.price_per_hour_usd == pytest.approx(PRICE, rel=1e-3)

    keys = {row.key: row for row in usage.by_key()}
    assert (keys["team-a"].batches, keys["team-b"].batches) == (2, 2)
    assert (keys["team-a"].input_tokens, keys["team-a"].cached_tokens) == (50, 10)
    assert (keys["team-a"].output_tokens, keys["team-a"].reasoning_tokens) == (50, 5)
    assert (keys["team-a"].gpu_s, keys["team-b"].gpu_s) == (1092, 468)
    # The keys' costs add up to the execution's whole time at the price: nothing counted twice, nothing lost.
    assert sum(row.cost_usd for row in keys.values()) == pytest.approx(usage.cost_usd, abs=1e-5)
    assert usage.cost_usd == pytest.approx(1560 * PRICE / 3600, rel=1e-3)
    assert "boot and idle hold" in usage.basis

    csv_lines = usage.as_csv("key").splitlines()
    assert csv_lines[0].startswith("key,day,batches,") and csv_lines[1].startswith("team-a,2027-01-15,2,")
    assert usage.as_json()["keys"][0]["key"] == "team-a"
    assert batch_usage.read_day(reader, date(2027, 1, 16)).batches == []  # the next day: none closed

    # `python -m infra.usage`: the same figures as CSV and JSON
    outputs = tmp_path / "outputs.json"
    deployed = {"data_bucket": BUCKET, "region": "us-east-1", "batch_api_url": "https://api.example"}
    outputs.write_text(json.dumps(deployed))

    assert usage_tool.main(["small", "--outputs", str(outputs), "--day", "2027-01-15", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == ["key", "team-a", "team-b"]
    assert usage_tool.main(["small", "--outputs", str(outputs), "--day", "2027-01-15", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert {b["id"] for b in exported["batches"]} == set(ids.values()) and exported["basis"] == batch_usage.BASIS
    # With the machine's executions (here: described), the same figures the report shares out.
    shared = usage_tool.day_usage(deployed, DAY, boto3.client("s3"), described)
    assert "boot and hold 560 s shared by 3 batch(es), 1 run(s) of no batch found" in usage_tool.render(shared)

    # `python -m infra.status STACK --batches`: each closed batch with its tokens, its job's cost and its share.
    listed = {row.id: row for row in list_batches(deployed, 10, boto3.client("s3"), described)}
    assert (listed[ids["alone"]].input_tokens, listed[ids["alone"]].output_tokens) == (40, 30)
    assert [listed[ids[name]].boot_hold_s for name in ("alone", "b", "a2", "failed")] == [336, 168, 56, 0]
    assert listed[ids["b"]].total_cost_usd == pytest.approx(rows[ids["b"]].cost_usd, abs=1e-6)
    assert "boot+hold" in render_batches(list(listed.values()))


def test_the_daily_report_reconciles_the_keys_with_the_injected_bill(
    moto_reset: str, a_day: tuple[S3Store, Described, dict[str, str]], topic_and_queue: tuple[str, str]
) -> None:
    """The bill by the Stack tag, injected into moto; the report's keys sum to the stack's metered total, and the
    difference line is Cost Explorer's total less it, made of parts that add up to it."""
    _, described, _ = a_day
    bill = {"Amazon Elastic Compute Cloud - Compute": 0.31, "Amazon Simple Storage Service": 0.02, "AWS KMS": 0.033}
    _load_ce_results(moto_reset, [_page(DAY, bill, None)])
    sns = boto3.client("sns", region_name="us-east-1")
    topic, queue = topic_and_queue
    settings = cost_report.ReportSettings("llm-batch-small", topic, 0.0, "Stack", BUCKET, ARN.split(":execution")[0])
    usage = batch_usage.read_day(batch_usage.BucketReader(boto3.client("s3"), BUCKET, described), DAY)

    report = cost_report.run_report(boto3.client("ce", region_name="us-east-1"), sns, settings, DAY, usage)

    gap = report["reconcile"]
    metered = 1560 * PRICE / 3600
    assert sum(key["cost_usd"] for key in report["usage"]["keys"]) == pytest.approx(gap["metered_usd"], abs=1e-5)
    assert gap["metered_usd"] == pytest.approx(metered, rel=1e-3)
    assert gap["cost_explorer_usd"] == pytest.approx(0.363)
    metered = gap["metered_usd"]  # the jobs' costs as their summaries round them
    assert gap["difference_usd"] == pytest.approx(0.363 - metered, abs=1e-6)
    assert gap["difference_pct"] == pytest.approx((0.363 - metered) / 0.363 * 100, abs=0.01)
    assert sum(gap["made_of"].values()) == pytest.approx(gap["difference_usd"], abs=1e-5)
    assert gap["made_of"]["Amazon Simple Storage Service"] == 0.02
    assert gap["made_of"]["Amazon Elastic Compute Cloud - Compute beyond the batches' GPU time"] == pytest.approx(
        0.31 - metered, abs=1e-6
    )
    (published,) = _received(queue)
    body = published["Message"]
    assert (
        f"Stack total metered (the batches): {metered:.2f} USD; Cost Explorer (Stack=llm-batch-small): 0.36 USD" in body
    )
    assert f"difference {0.363 - metered:.2f} USD ({(0.363 - metered) / 0.363 * 100:.1f}% of Cost Explorer's)" in body
    assert "team-a" in body and "Basis: a batch's cost is its job's" in body
