"""`python -m infra.run` and `python -m infra.status` against the small state machine running on moto."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from infra import statemachines
from infra.ops import run, status
from infra.ops.stack_outputs import OutputsError, load_outputs
from tests.infra.nightly_aws import (
    NIGHT_HALF_UPLOADED,
    NIGHT_WITHOUT_INPUT,
    FakeInstance,
    SmallStack,
    create_small_stack,
    create_state_machine,
    executing_state_machines,
    summary,
    wait_for_end,
)


@pytest.fixture
def deployed(moto_reset: str, tmp_path: Path) -> Iterator[tuple[SmallStack, Path]]:
    """A small stack with its nightly state machine, and its outputs saved as `pulumi stack output --json`."""
    with executing_state_machines(moto_reset):
        stack = create_small_stack()
        definition = statemachines.render("small.asl.json", stack.substitutions(MaxPolls=5))
        stack.state_machine_arn = create_state_machine("llm-batch-small-nightly", definition)
        outputs = tmp_path / "outputs.json"
        outputs.write_text(
            json.dumps(
                {
                    "nightly_state_machine_arn": stack.state_machine_arn,
                    "data_bucket": stack.bucket,
                    "region": "us-east-1",
                }
            )
        )
        yield stack, outputs


def test_run_now_then_status_shows_state_rows_and_cost(
    deployed: tuple[SmallStack, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    stack, outputs = deployed
    instance = FakeInstance(stack, [("summary.json", summary(rows=250))])
    instance.start()
    assert run.main(["small", "--outputs", str(outputs), "--date", "2026-11-27"]) == 0
    started = capsys.readouterr().out
    assert "for 2026-11-27" in started
    execution_arn = started.split(": ", 1)[1].split()[0]
    assert wait_for_end(execution_arn)["status"] == "SUCCEEDED"

    # A second night that fails: the deadline passes with no summary.
    assert run.main(["small", "--outputs", str(outputs), "--date", "2026-11-28"]) == 0
    second = capsys.readouterr().out.split(": ", 1)[1].split()[0]
    assert wait_for_end(second)["status"] == "FAILED"

    assert status.main(["small", "--outputs", str(outputs), "--price-per-hour", "1.006", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_date = {row["date"]: row for row in rows}
    ok, failed = by_date["2026-11-27"], by_date["2026-11-28"]
    assert ok["state"] == "SUCCEEDED" and (ok["rows_in"], ok["rows_ok"], ok["rows_failed"]) == (250, 249, 1)
    assert ok["cost_usd"] == round(ok["duration_s"] / 3600 * 1.006, 2)
    assert failed["state"] == "FAILED" and failed["rows_in"] is None
    assert failed["reason"].startswith("DeadlineExceeded: no summary.json under s3://llm-batch-small-data/output/")

    assert status.main(["small", "--outputs", str(outputs)]) == 0
    table = capsys.readouterr().out
    assert "SUCCEEDED" in table and "249/250" in table and "DeadlineExceeded" in table


def test_status_prefers_the_jobs_own_cost(deployed: tuple[SmallStack, Path]) -> None:
    stack, outputs = deployed
    instance = FakeInstance(stack, [("summary.json", {**summary(), "cost_usd": 0.4242})])
    instance.start()
    execution_arn = run.start_run(load_outputs("small", str(outputs)), "2026-11-26")
    assert wait_for_end(execution_arn)["status"] == "SUCCEEDED"
    (row,) = status.last_runs(load_outputs("small", str(outputs)), price_per_hour=99.0)
    assert (row.cost_usd, row.cost_basis) == (0.42, "job")


def test_status_shows_a_night_without_input_as_skipped(
    deployed: tuple[SmallStack, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, outputs = deployed
    execution_arn = run.start_run(load_outputs("small", str(outputs)), NIGHT_WITHOUT_INPUT)
    assert wait_for_end(execution_arn)["status"] == "SUCCEEDED"
    (row,) = status.last_runs(load_outputs("small", str(outputs)))
    assert (row.state, row.date) == ("SKIPPED", NIGHT_WITHOUT_INPUT)
    assert (
        row.reason == f"no input under s3://llm-batch-small-data/input/{NIGHT_WITHOUT_INPUT}/ marked ready (no _READY)"
    )
    assert status.main(["small", "--outputs", str(outputs)]) == 0
    assert "SKIPPED" in capsys.readouterr().out


def test_run_refuses_a_night_whose_upload_is_not_marked_ready(
    deployed: tuple[SmallStack, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    stack, outputs = deployed
    assert run.main(["small", "--outputs", str(outputs), "--date", NIGHT_HALF_UPLOADED]) == 2
    error = capsys.readouterr().err
    assert f"s3://{stack.bucket}/input/{NIGHT_HALF_UPLOADED}/_READY is missing" in error
    assert f"put-object --bucket {stack.bucket} --key input/{NIGHT_HALF_UPLOADED}/_READY" in error
    sfn = boto3.client("stepfunctions")
    assert sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"] == []


def test_run_refuses_while_a_run_is_going(
    deployed: tuple[SmallStack, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, outputs = deployed
    first = run.start_run(load_outputs("small", str(outputs)), "2026-11-28")
    try:
        assert run.main(["small", "--outputs", str(outputs)]) == 2
        assert "already going" in capsys.readouterr().err
    finally:
        boto3.client("stepfunctions").stop_execution(executionArn=first)


def test_status_with_no_runs_says_so(deployed: tuple[SmallStack, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, outputs = deployed
    assert status.main(["small", "--outputs", str(outputs)]) == 0
    assert "(no runs yet)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("not json", "is not JSON"),
        ("{}", "lack nightly_state_machine_arn"),
    ],
)
def test_bad_outputs_are_named(
    content: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "outputs.json"
    if content is not None:
        path.write_text(content)
    assert run.main(["small", "--outputs", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_date_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({"nightly_state_machine_arn": "arn:aws:states:us-east-1:1:stateMachine:x"}))
    assert run.main(["small", "--outputs", str(path), "--date", "28.11.2026"]) == 2
    assert "--date must be YYYY-MM-DD" in capsys.readouterr().err


def test_without_pulumi_or_a_file_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(OutputsError, match="pass --outputs FILE"):
        load_outputs("small")


def test_run_batch_invokes_the_stacks_tick_function_and_names_its_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """botocore's Stubber stands in for the deployed function (moto runs Lambda code only in a container); the
    function's side, `{"start_batch": ID}`, runs against moto in tests/workload/test_batch_api_lambda.py."""
    import io

    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    def payload(body: dict[str, str]) -> StreamingBody:
        raw = json.dumps(body).encode()
        return StreamingBody(io.BytesIO(raw), len(raw))

    outputs = {"batch_api_tick_function_name": "llm-batch-small-batch-api-tick", "region": "us-east-1"}
    client = boto3.client("lambda", region_name="us-east-1")
    with Stubber(client) as stub:
        expected = {"FunctionName": "llm-batch-small-batch-api-tick", "Payload": b'{"start_batch": "batch_1"}'}
        stub.add_response("invoke", {"StatusCode": 200, "Payload": payload({"status": "running"})}, expected)
        assert run.start_batch(outputs, "batch_1", client) == "running"
        refusal = {"error": "batch batch_0 is running; batch_1 starts after it (one job on the GPUs)"}
        stub.add_response("invoke", {"StatusCode": 200, "Payload": payload(refusal)}, expected)
        with pytest.raises(run.RunError, match="did not start: batch batch_0 is running"):
            run.start_batch(outputs, "batch_1", client)
    # The tick's reserved concurrency held by another tick past botocore's retries: a named refusal.
    from botocore.config import Config

    once = boto3.client("lambda", region_name="us-east-1", config=Config(retries={"max_attempts": 1}))
    with Stubber(once) as stub:
        stub.add_client_error("invoke", "TooManyRequestsException", "Rate Exceeded.", 429, expected_params=expected)
        with pytest.raises(run.RunError, match="batch_1 did not start: the tick function is busy"):
            run.start_batch(outputs, "batch_1", once)
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({"nightly_state_machine_arn": "arn:aws:states:us-east-1:1:stateMachine:x"}))
    assert run.main(["small", "--outputs", str(path), "--batch", "batch_1"]) == 2
    assert "no Batch API (no batch_api_tick_function_name output): set batch_api.enabled" in capsys.readouterr().err
    assert run.main(["small", "--outputs", str(path), "--batch", "file-1"]) == 2
    assert "--batch takes a Batch API batch id" in capsys.readouterr().err


def test_status_lists_the_batch_apis_batches_newest_first_with_their_cost(
    moto_reset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The batches written by the API's own service and S3Store (as the deployed functions write them), read
    back by the operator tool from the bucket alone."""
    from tests.workload.test_batch_api import Clock, _line
    from tests.workload.test_batch_api_metrics import Scripted, _job_finishes
    from workload.batch_api.executor import RunState
    from workload.batch_api.s3_store import S3Store
    from workload.batch_api.service import BatchService

    boto3.client("s3").create_bucket(Bucket="llm-batch-small-data")
    clock, executor = Clock(), Scripted()
    service = BatchService(S3Store(boto3.client("s3"), "llm-batch-small-data"), executor, "llm-batch", clock=clock)
    two = service.upload_file("p", "in.jsonl", "batch", [(_line("a") + _line("b")).encode()])["id"]
    done = service.create_batch("p", two, "/v1/chat/completions", "24h")["id"]
    service.tick()
    _job_finishes(service, done, wall_s=812.5, cost_usd=0.2274)
    executor.states[done] = RunState("succeeded")
    service.tick()
    clock.now += 60
    empty = service.upload_file("p", "empty.jsonl", "batch", [b"\n"])["id"]
    failed = service.create_batch("p", empty, "/v1/chat/completions", "24h")["id"]
    clock.now += 60
    queued = service.create_batch("p", two, "/v1/chat/completions", "24h")["id"]
    outputs = tmp_path / "outputs.json"
    deployed = {"data_bucket": "llm-batch-small-data", "region": "us-east-1", "batch_api_url": "https://api.example"}
    outputs.write_text(json.dumps(deployed))

    assert status.main(["small", "--outputs", str(outputs), "--batches", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    newest_first = [(queued, "validating"), (failed, "failed"), (done, "completed")]
    assert [(row["id"], row["status"]) for row in rows] == newest_first
    assert {k: rows[2][k] for k in ("total", "completed", "failed", "job_wall_s", "cost_usd")} == {
        "total": 2, "completed": 2, "failed": 0, "job_wall_s": 812.5, "cost_usd": 0.2274,
    }  # fmt: skip
    assert rows[1]["reason"] == "empty_file: the input file holds no request" and rows[1]["cost_usd"] is None
    assert status.main(["small", "--outputs", str(outputs), "--batches", "--limit", "1"]) == 0
    table = capsys.readouterr().out
    assert queued in table and done not in table and "done/failed/total" in table
    # One page costs one listing of the order markers and a read per batch shown, however many there are (issue 61).
    from infra.ops.status_batches import list_batches
    from tests.workload.store_reads import count_s3_requests

    client = boto3.client("s3")
    counted = count_s3_requests(client)
    assert [row.id for row in list_batches(deployed, 2, client)] == [queued, failed]
    assert counted == {"LIST": 1, "GET": 2}

    outputs.write_text(json.dumps({k: v for k, v in deployed.items() if k != "batch_api_url"}))
    assert status.main(["small", "--outputs", str(outputs), "--batches"]) == 2
    assert "no Batch API (no batch_api_url output): set batch_api.enabled" in capsys.readouterr().err


def test_status_dates_a_running_batch_execution_by_its_batch(deployed: tuple[SmallStack, Path]) -> None:
    """A Batch API batch's execution has no `date` of its own, and while it runs no output either: its input
    carries the start's date beside the batch (sfn_executor.run_input)."""
    from workload.batch_api.executor import BatchRun
    from workload.batch_api.sfn_executor import run_input

    stack, outputs = deployed
    boto3.client("s3").put_object(Bucket=stack.bucket, Key="batch-api/files/file-1", Body=b"{}\n")
    output = f"s3://{stack.bucket}/batch-api/batches/batch_1/output"
    batch = BatchRun("batch_1", f"s3://{stack.bucket}/batch-api/files/file-1", output, "/v1/chat/completions")
    sfn = boto3.client("stepfunctions")
    started = sfn.start_execution(
        stateMachineArn=stack.state_machine_arn, name="batch_1-1", input=json.dumps(run_input(batch, "2026-12-02"))
    )
    try:
        (row,) = status.last_runs(load_outputs("small", str(outputs)))
        assert (row.name, row.state, row.date) == ("batch_1-1", "RUNNING", "2026-12-02")
    finally:
        sfn.stop_execution(executionArn=started["executionArn"])
