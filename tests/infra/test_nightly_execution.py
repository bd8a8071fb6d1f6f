"""The small tier's nightly state machine and sweep, executed by a real moto server.

moto runs the definitions and calls S3, Auto Scaling, SNS and Step Functions over HTTP. The EKS definition
runs in tests/infra/test_nightly_eks_execution.py (its function in-process behind moto's Lambda API). The
sweeps call `aws-sdk:sfn:listExecutions` with AWS's PascalCase parameters, which moto forwards unconverted
to its camelCase Step Functions API (a KeyError there), so the sweeps are covered by the graph tests only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from infra import statemachines
from infra.statemachines import graph
from tests.infra.nightly_aws import (
    NIGHT_HALF_UPLOADED,
    NIGHT_WITHOUT_INPUT,
    FakeInstance,
    SmallStack,
    create_small_stack,
    create_state_machine,
    executing_state_machines,
    summary,
    wait_for,
    wait_for_end,
)
from workload.batch_api.executor import BatchRun
from workload.batch_api.pools import PoolSettings
from workload.batch_api.s3_store import S3Store
from workload.batch_api.service import BatchService
from workload.batch_api.sfn_executor import StepFunctionsExecutor, run_input


@pytest.fixture
def small_stack(moto_reset: str) -> Iterator[SmallStack]:
    with executing_state_machines(moto_reset):
        yield create_small_stack()


def _start(stack: SmallStack, execution_input: dict[str, Any] | None = None, **overrides: int) -> str:
    definition = statemachines.render("small.asl.json", stack.substitutions(**overrides))
    stack.state_machine_arn = create_state_machine("llm-batch-small-nightly", definition)
    return str(
        boto3.client("stepfunctions").start_execution(
            stateMachineArn=stack.state_machine_arn, input=json.dumps(execution_input or {})
        )["executionArn"]
    )


def test_a_run_scales_up_waits_for_the_summary_and_scales_down(small_stack: SmallStack) -> None:
    instance = FakeInstance(small_stack, [("summary.json", summary(rows=100))])
    instance.start()
    execution = _start(small_stack, {"date": "2026-11-28"})
    result = wait_for_end(execution)
    instance.join(timeout=5)
    assert instance.error is None
    assert result["status"] == "SUCCEEDED", result
    assert small_stack.desired_capacity() == 0
    (request,) = instance.requests
    assert request["input_uri"] == "s3://llm-batch-small-data/input/2026-11-28/"
    assert request["output_uri"] == "s3://llm-batch-small-data/output/2026-11-28/"
    output = json.loads(result["output"])
    assert output["summary_uri"] == "s3://llm-batch-small-data/output/2026-11-28/summary.json"
    assert output["attempts"] == 1
    assert small_stack.alerts() == []


def test_a_scheduled_run_takes_the_date_of_its_scheduled_time(small_stack: SmallStack) -> None:
    """EventBridge Scheduler passes `{"scheduled_time": "<aws.scheduler.scheduled-time>"}`.

    (A bare start falls back to `$$.Execution.StartTime`; moto hands that to intrinsics as a datetime, not
    AWS's string, so that branch is checked by the validator and graph tests only.)
    """
    instance = FakeInstance(small_stack, [("summary.json", summary())])
    instance.start()
    result = wait_for_end(_start(small_stack, {"scheduled_time": "2026-11-29T01:00:00Z"}))
    assert result["status"] == "SUCCEEDED", result
    assert json.loads(result["output"])["date"] == "2026-11-29"
    assert instance.requests[0]["output_uri"] == "s3://llm-batch-small-data/output/2026-11-29/"


def test_a_batch_runs_on_its_own_input_and_output_through_the_executor(small_stack: SmallStack) -> None:
    """The Batch API's executor starts the machine with `$.batch`: the run request carries the batch's file,
    output and endpoint (the boot script's job reads it as an OpenAI batch), not a night's prefixes."""
    s3 = boto3.client("s3")
    store = S3Store(s3, small_stack.bucket)
    store.write_blob("files/file-1/body", [b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings"}\n'])
    definition = statemachines.render("small.asl.json", small_stack.substitutions())
    arn = create_state_machine("llm-batch-small-nightly", definition)
    instance = FakeInstance(small_stack, [("summary.json", summary(rows=1))])
    instance.start()
    executor = StepFunctionsExecutor(boto3.client("stepfunctions"), store, arn)
    executor.start(
        BatchRun("batch_1", store.uri("files/file-1/body"), store.uri("batches/batch_1/output"), "/v1/embeddings")
    )
    marker = json.loads(b"".join(store.read_blob("batches/batch_1/execution.json") or []))
    result = wait_for_end(marker["execution_arn"])
    instance.join(timeout=5)
    assert instance.error is None
    assert result["status"] == "SUCCEEDED", result
    (request,) = instance.requests
    assert request["batch_id"] == "batch_1"
    assert request["input_uri"] == "s3://llm-batch-small-data/batch-api/files/file-1/body"
    assert request["output_uri"] == "s3://llm-batch-small-data/batch-api/batches/batch_1/output"
    assert (request["input_format"], request["openai_url"]) == ("openai", "/v1/embeddings")
    output = json.loads(result["output"])
    assert output["summary_uri"] == "s3://llm-batch-small-data/batch-api/batches/batch_1/output/summary.json"
    assert executor.state("batch_1").name == "succeeded"
    assert small_stack.desired_capacity() == 0


def test_batches_sharing_a_run_pass_the_machines_checks_and_close_each_on_its_own(small_stack: SmallStack) -> None:
    """Issue 62 on the small tier: two queued batches of one endpoint share one execution. Its input is the pool's
    spec (under batch-api/files/, which CheckBatchUris lets a run read) and its output the pool's folder (under
    batch-api/batches/*/output); the instance (FakeInstance, the job's stand-in here) is asked to run exactly that,
    and each batch closes from its own folder, which the job's pool mode writes as a lone run would."""
    s3 = boto3.client("s3")
    store = S3Store(s3, small_stack.bucket)
    definition = statemachines.render("small.asl.json", small_stack.substitutions())
    arn = create_state_machine("llm-batch-small-nightly", definition)
    executor = StepFunctionsExecutor(boto3.client("stepfunctions"), store, arn)
    service = BatchService(store, executor, "llm-batch", pool_settings=PoolSettings(max_batches=2))
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}\n'
    file_id = service.upload_file("project", "in.jsonl", "batch", [line])["id"]
    first, second = (service.create_batch("project", file_id, "/v1/chat/completions", "24h")["id"] for _ in "ab")
    instance = FakeInstance(small_stack, [("summary.json", {"pool": "p", "members": {}})])
    instance.start()
    service.tick()
    pool = service.batches.get(first).pool_id  # type: ignore[union-attr]
    assert pool is not None and service.batches.get(second).pool_id == pool  # type: ignore[union-attr]
    for member in (first, second):  # what the pool job writes in each member's own folder
        store.write_blob(f"batches/{member}/output/summary.json", [json.dumps(summary(rows=1)).encode()])
    marker = json.loads(b"".join(store.read_blob(f"batches/{pool}/execution.json") or []))
    result = wait_for_end(marker["execution_arn"])
    instance.join(timeout=5)
    assert instance.error is None
    assert result["status"] == "SUCCEEDED", result
    (request,) = instance.requests
    assert request["input_uri"] == f"s3://llm-batch-small-data/batch-api/files/pools/{pool}.pool.json"
    assert request["output_uri"] == f"s3://llm-batch-small-data/batch-api/batches/{pool}/output"
    service.tick()
    assert [service.get_batch("project", b)["status"] for b in (first, second)] == ["completed", "completed"]
    assert store.blob_size(f"files/pools/{pool}.pool.json") is None  # the run's spec goes with it
    assert small_stack.desired_capacity() == 0


def test_a_batch_whose_file_is_gone_starts_no_gpu(small_stack: SmallStack) -> None:
    store = S3Store(boto3.client("s3"), small_stack.bucket)
    run = BatchRun("batch_2", store.uri("files/gone/body"), store.uri("batches/batch_2/output"), "/v1/embeddings")
    result = wait_for_end(_start(small_stack, run_input(run)))
    assert result["status"] == "SUCCEEDED", result
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "files/gone/body" in alert


@pytest.mark.parametrize(
    ("input_key", "output_key"),
    [("job-settings/secret", "batches/b/output"), ("files/f/body", "output/2026-11-28"), ("files/f", "batches/b/out")],
)
def test_a_batch_outside_the_apis_prefix_is_refused_before_any_gpu(
    small_stack: SmallStack, input_key: str, output_key: str
) -> None:
    """Issue 60: PlanBatch runs only the Batch API's own objects. Fails on main, which ran any URI it was given
    (another tenant's night, the stack's other prefixes) with the job's role."""
    s3 = boto3.client("s3")
    s3.put_object(Bucket=small_stack.bucket, Key="job-settings/secret", Body=b"{}\n")
    store = S3Store(s3, small_stack.bucket, "")  # keys as given, so a run can name objects outside batch-api/
    run = BatchRun("batch_3", store.uri(input_key), store.uri(output_key), "/v1/chat/completions")
    result = wait_for_end(_start(small_stack, run_input(run)))
    assert result["status"] == "FAILED" and json.loads(result["cause"])["Error"] == "BatchOutsideApi", result
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "outside s3://llm-batch-small-data/batch-api/" in alert


def test_an_interruption_is_retried_on_the_same_output_and_resumes(small_stack: SmallStack) -> None:
    instance = FakeInstance(
        small_stack,
        [("_interrupted.json", {"reason": "spot interruption notice"}), ("summary.json", summary())],
    )
    instance.start()
    result = wait_for_end(_start(small_stack, {"date": "2026-11-28"}))
    instance.join(timeout=5)
    assert instance.error is None
    assert result["status"] == "SUCCEEDED", result
    assert json.loads(result["output"])["attempts"] == 2
    first, second = instance.requests
    assert first["output_uri"] == second["output_uri"], "a retry must reuse the output so the job resumes"
    assert small_stack.desired_capacity() == 0


def test_too_many_interruptions_fail_release_and_notify(small_stack: SmallStack) -> None:
    instance = FakeInstance(small_stack, [("_interrupted.json", {"reason": "spot"})])
    instance.start()
    result = wait_for_end(_start(small_stack, {"date": "2026-11-28"}, MaxAttempts=1))
    assert result["status"] == "FAILED"
    assert json.loads(result["cause"])["Error"] == "RetriesExhausted"
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "RetriesExhausted" in alert


def test_a_failed_job_releases_and_notifies_with_the_reason(small_stack: SmallStack) -> None:
    s3 = boto3.client("s3")
    execution = _start(small_stack, {"date": "2026-11-28"})
    wait_for(lambda: small_stack.desired_capacity() == 1, what="the group to scale to 1")
    # What the job writes on a failure it cannot recover from: the reason in the body and in metadata.
    s3.put_object(
        Bucket=small_stack.bucket,
        Key="output/2026-11-28/_failed.json",
        Body=json.dumps({"reason": "input prefix is empty"}).encode(),
        Metadata={"reason": "input prefix is empty"},
    )
    result = wait_for_end(execution)
    assert result["status"] == "FAILED"
    assert result["error"] == "NightlyRunFailed"
    cause = json.loads(result["cause"])
    assert cause["Error"] == "JobFailed" and "input prefix is empty" in cause["Cause"]
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "input prefix is empty" in alert and "2026-11-28" in alert and "released" in alert


def test_a_rerun_of_a_failed_night_ignores_the_last_runs_markers(small_stack: SmallStack) -> None:
    """Markers of the previous run are cleared at the start; committed shards are not (the job resumes)."""
    s3 = boto3.client("s3")
    for key in ("_failed.json", "_interrupted.json", "results/shard-00000.parquet"):
        s3.put_object(Bucket=small_stack.bucket, Key=f"output/2026-11-28/{key}", Body=b"{}")
    instance = FakeInstance(small_stack, [("summary.json", summary())])
    instance.start()
    result = wait_for_end(_start(small_stack, {"date": "2026-11-28"}))
    assert result["status"] == "SUCCEEDED", result
    assert json.loads(result["output"])["attempts"] == 1
    left = s3.list_objects_v2(Bucket=small_stack.bucket, Prefix="output/2026-11-28/")["Contents"]
    assert sorted(item["Key"] for item in left) == [
        "output/2026-11-28/results/shard-00000.parquet",
        "output/2026-11-28/summary.json",
    ]


def test_the_deadline_ends_a_run_that_never_reports(small_stack: SmallStack) -> None:
    result = wait_for_end(_start(small_stack, {"date": "2026-11-28"}, MaxPolls=3))
    assert result["status"] == "FAILED"
    assert json.loads(result["cause"])["Error"] == "DeadlineExceeded"
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "DeadlineExceeded" in alert


def test_a_failing_task_is_caught_and_the_capacity_still_released(small_stack: SmallStack) -> None:
    """The data bucket is gone: the first task fails, its catch releases, notifies and fails the run."""
    small_stack.bucket = "llm-batch-no-such-bucket"
    result = wait_for_end(_start(small_stack, {"date": "2026-11-28"}))
    assert result["status"] == "FAILED"
    assert "NoSuchBucket" in json.loads(result["cause"])["Error"]
    assert small_stack.desired_capacity() == 0
    assert len(small_stack.alerts()) == 1


def test_a_night_without_input_is_skipped_and_starts_no_gpu(small_stack: SmallStack) -> None:
    """Nothing under input/<date>/: the run ends "skipped" with one notification, before any capacity start."""
    result = wait_for_end(_start(small_stack, {"date": NIGHT_WITHOUT_INPUT}))
    assert result["status"] == "SUCCEEDED", result
    output = json.loads(result["output"])
    assert output["status"] == "skipped" and output["date"] == NIGHT_WITHOUT_INPUT
    assert (
        output["reason"]
        == f"no input under s3://llm-batch-small-data/input/{NIGHT_WITHOUT_INPUT}/ marked ready (no _READY)"
    )
    # The instance's run request is written just before the group is scaled up: never reached.
    listed = boto3.client("s3").list_objects_v2(Bucket=small_stack.bucket, Prefix="control/")
    assert listed["KeyCount"] == 0
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "skipped" in alert and "No GPU was started" in alert and NIGHT_WITHOUT_INPUT in alert


def test_a_half_uploaded_night_is_skipped_until_its_ready_marker_is_written(small_stack: SmallStack) -> None:
    """Parts under input/<date>/ but no _READY (the uploader writes it last): no GPU starts on half an input."""
    result = wait_for_end(_start(small_stack, {"date": NIGHT_HALF_UPLOADED}))
    assert result["status"] == "SUCCEEDED", result
    output = json.loads(result["output"])
    assert output["status"] == "skipped" and "_READY" in output["reason"]
    assert boto3.client("s3").list_objects_v2(Bucket=small_stack.bucket, Prefix="control/")["KeyCount"] == 0
    assert small_stack.desired_capacity() == 0
    (alert,) = small_stack.alerts()
    assert "_READY" in alert and "No GPU was started" in alert


@pytest.mark.parametrize("file_name", ["small.asl.json", "eks.asl.json"])
def test_the_skipped_branch_reaches_no_capacity_start(file_name: str) -> None:
    definition = statemachines.load(file_name)
    assert definition["States"]["InputPresent"]["Default"] == "NotifySkipped"
    skipped = graph.reachable(definition, "NotifySkipped")
    starts = graph.matching(definition, graph.is_capacity_start)
    assert starts and not skipped & starts
    assert "RunSkipped" in skipped and "RunFailed" not in skipped
