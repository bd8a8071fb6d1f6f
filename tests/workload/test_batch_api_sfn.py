"""The tiers' executor against moto's Step Functions, S3 and Auto Scaling: a queue of batches runs as one
execution at a time of the stack's state machine, a cancel stops its execution and releases the GPU group, and
an execution's end (succeeded, failed, aborted) becomes the batch's."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.infra.nightly_aws import create_state_machine, executing_state_machines, wait_for
from tests.workload.test_batch_api import Clock, _line
from workload.batch_api.executor import BatchRun
from workload.batch_api.s3_store import S3Store
from workload.batch_api.service import BatchService
from workload.batch_api.sfn_executor import StepFunctionsExecutor

WAITS = {"StartAt": "Run", "States": {"Run": {"Type": "Wait", "Seconds": 86400, "End": True}}}


def _machine(definition: dict[str, Any]) -> str:
    return create_state_machine(f"llm-batch-test-{secrets.token_hex(4)}", definition)


@pytest.fixture
def store(moto_endpoint: str) -> Iterator[S3Store]:
    client = boto3.client("s3")
    bucket = f"sfn-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    yield S3Store(client, bucket)


def _gpu_group() -> str:
    autoscaling = boto3.client("autoscaling")
    name = f"gpu-{secrets.token_hex(4)}"
    autoscaling.create_launch_configuration(
        LaunchConfigurationName=name, ImageId="ami-12c6146b", InstanceType="t3.micro"
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchConfigurationName=name, MinSize=0, MaxSize=1, DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )  # fmt: skip
    return name


def _desired(group: str) -> int:
    found = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    return int(found["AutoScalingGroups"][0]["DesiredCapacity"])


def test_a_queue_runs_one_execution_at_a_time_and_a_cancel_releases_the_gpus(store: S3Store) -> None:
    sfn, group = boto3.client("stepfunctions"), _gpu_group()
    machine = _machine(WAITS)
    executor = StepFunctionsExecutor(sfn, store, machine, capacity=(boto3.client("autoscaling"), group))
    service = BatchService(store, executor, "llm-batch", clock=Clock())
    body = (_line("a") + _line("b")).encode()
    first_file = service.upload_file("project", "a.jsonl", "batch", [body])
    first = service.create_batch("project", first_file["id"], "/v1/chat/completions", "24h")
    second = service.create_batch("project", first_file["id"], "/v1/chat/completions", "24h")

    service.tick()
    assert service.get_batch("project", first["id"])["status"] == "in_progress"
    assert service.get_batch("project", second["id"])["status"] == "validating"  # queued behind it
    (running,) = sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]
    given = json.loads(sfn.describe_execution(executionArn=running["executionArn"])["input"])["batch"]
    assert given == {
        "id": first["id"],
        "date": given["date"],
        "input_uri": f"s3://{store.bucket}/batch-api/files/{first_file['id']}.jsonl",
        "input_key": f"batch-api/files/{first_file['id']}.jsonl",
        "output_uri": f"s3://{store.bucket}/batch-api/batches/{first['id']}/output",
        "output_key": f"batch-api/batches/{first['id']}/output",
        "endpoint": "/v1/chat/completions",
    }
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", given["date"])  # the UTC date: the run's log stream and markers
    service.tick()  # still running: no second execution
    assert len(sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]) == 1

    assert service.cancel_batch("project", first["id"])["status"] == "cancelling"
    assert sfn.describe_execution(executionArn=running["executionArn"])["status"] == "ABORTED"
    assert _desired(group) == 0  # the stopped execution skips its release step: the executor released them
    service.tick()
    assert service.get_batch("project", first["id"])["status"] == "cancelled"
    service.tick()
    assert service.get_batch("project", second["id"])["status"] == "in_progress"  # the next in the queue


def test_a_batch_waits_while_another_run_holds_the_gpus(store: S3Store) -> None:
    sfn = boto3.client("stepfunctions")
    machine = _machine(WAITS)
    night = sfn.start_execution(stateMachineArn=machine, name="manual-2026-12-01", input=json.dumps({"date": "x"}))
    executor = StepFunctionsExecutor(sfn, store, machine)
    run = BatchRun("batch_w", "s3://b/in.jsonl", "s3://b/out", "/v1/chat/completions")
    executor.start(run)
    waiting = executor.state("batch_w")
    assert waiting.name == "busy" and "manual-2026-12-01" in (waiting.reason or "")
    sfn.stop_execution(executionArn=night["executionArn"])
    executor.start(run)  # the scheduler's next tick: the GPUs are free
    assert executor.state("batch_w").name == "running"
    executor.start(run)  # a repeated start follows the same execution
    assert len(sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]) == 1
    executor.stop("batch_w")
    assert executor.state("batch_w").name == "stopped"


def test_an_executions_end_is_the_runs(store: S3Store, moto_endpoint: str) -> None:
    sfn = boto3.client("stepfunctions")
    # moto runs executions only of machines created while its execution switch is on, and only while it stays on.
    run = BatchRun("batch_e", "s3://b/in.jsonl", "s3://b/out", "/v1/chat/completions")
    with executing_state_machines(moto_endpoint):
        failing = _machine({"StartAt": "F", "States": {"F": {"Type": "Fail", "Error": "JobFailed", "Cause": "oom"}}})
        passing = _machine({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
        executor = StepFunctionsExecutor(sfn, store, failing)
        executor.start(run)
        wait_for(lambda: executor.state("batch_e").name != "running", 30, "the failing execution to end")
        failed = executor.state("batch_e")
        assert failed.name == "failed" and "JobFailed oom" in (failed.reason or "")
        done = StepFunctionsExecutor(sfn, store, passing)
        done.start(BatchRun("batch_p", "s3://b/in.jsonl", "s3://b/out", "/v1/chat/completions"))
        wait_for(lambda: done.state("batch_p").name == "succeeded", 30, "the passing execution to succeed")
    with pytest.raises(ValueError, match="not a state machine ARN"):
        StepFunctionsExecutor(sfn, store, "nightly")


def _summary(store: S3Store, batch_id: str) -> None:
    store.write_blob(f"batches/{batch_id}/output/summary.json", [json.dumps({"rows_in": 2, "input_tokens": 1,
                     "output_tokens": 1}).encode()])  # fmt: skip


def test_batches_sharing_one_execution_each_have_their_own_state_and_cancel(store: S3Store) -> None:
    """The queue drain's units: the execution's NextBatch (`next_run`) claims the oldest queued batch for it; a
    batch that ended is told by its markers while the execution runs on; a cancel of a batch the execution left
    stops nothing, a cancel of the batch it is on stops it and releases the GPUs; the poll budget ends the drain."""
    sfn, group = boto3.client("stepfunctions"), _gpu_group()
    machine = _machine(WAITS)
    executor = StepFunctionsExecutor(sfn, store, machine, capacity=(boto3.client("autoscaling"), group))
    clock = Clock()
    service = BatchService(store, executor, "llm-batch", clock=clock)
    file_id = service.upload_file("project", "a.jsonl", "batch", [_line("a").encode()])["id"]
    a, b, c, d = (service.create_batch("project", file_id, "/v1/chat/completions", "24h")["id"] for _ in "abcd")
    service.tick()
    (execution,) = sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]
    arn = execution["executionArn"]

    _summary(store, a)  # A's job ended well; the execution's NextBatch asks for the next
    asked = "2026-12-02T01:00:00.000Z"  # $$.State.EnteredTime: the same on a retry of the step
    taken = service.next_run(arn, polls=12, max_polls=30, poll_budget=100, asked=asked)
    # A retry (the answer lost on its way) gets the same run: nothing more claimed, no polls counted twice.
    assert service.next_run(arn, polls=12, max_polls=30, poll_budget=100, asked=asked) == taken
    assert service.get_batch("project", c)["status"] == "validating"
    assert taken["run"]["batch"]["id"] == b and taken["run"]["batch"]["output_key"] == f"batch-api/batches/{b}/output"
    assert executor.state(a).name == "succeeded" and executor.state(b).name == "running"
    service.tick()  # A completes from its markers; no second execution starts beside the running one
    assert service.get_batch("project", a)["status"] == "completed"
    assert service.get_batch("project", b)["status"] == "in_progress"
    assert len(sfn.list_executions(stateMachineArn=machine)["executions"]) == 1

    store.delete_blobs(f"files/{file_id}.jsonl")  # C's file goes while it waits: the claim fails it, takes none
    _summary(store, b)
    assert service.next_run(arn, polls=12, max_polls=30, poll_budget=100) == {"none": "no batch is queued"}
    assert service.get_batch("project", c)["status"] == "failed"
    assert service.get_batch("project", d)["status"] == "failed"

    later = service.upload_file("project", "b.jsonl", "batch", [_line("b").encode()])["id"]
    e, f = (service.create_batch("project", later, "/v1/chat/completions", "24h")["id"] for _ in "ef")
    assert service.next_run(arn, polls=12, max_polls=30, poll_budget=100)["run"]["batch"]["id"] == e
    # A cancel of B, which the execution has left (its summary is written), must not stop E's run.
    assert service.cancel_batch("project", b)["status"] == "cancelling"
    assert sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"
    # 36 polls spent, 48 with E's run: one more run of 30 would pass a budget of 60, so the execution releases.
    ended = service.next_run(arn, polls=12, max_polls=30, poll_budget=60)
    assert "spent 48 of its 60 polls" in ended["none"]
    assert service.get_batch("project", f)["status"] == "validating"  # left for the next execution
    assert service.cancel_batch("project", e)["status"] == "cancelling"  # the batch the execution is on
    assert sfn.describe_execution(executionArn=arn)["status"] == "ABORTED"
    assert _desired(group) == 0
    service.tick()
    assert service.get_batch("project", e)["status"] == "cancelled"
    assert service.get_batch("project", f)["status"] == "in_progress"  # a new execution for the rest


def test_a_batch_the_execution_passed_over_is_failed_not_followed_forever(store: S3Store) -> None:
    sfn = boto3.client("stepfunctions")
    machine = _machine(WAITS)
    executor = StepFunctionsExecutor(sfn, store, machine)
    uri = store.uri("batches/{}/output")
    run_a = BatchRun("batch_a", store.uri("files/x.jsonl"), uri.format("batch_a"), "/v1/chat/completions")
    run_b = BatchRun("batch_b", store.uri("files/x.jsonl"), uri.format("batch_b"), "/v1/chat/completions")
    executor.start(run_a)
    arn = json.loads(b"".join(store.read_blob("batches/batch_a/execution.json") or []))["execution_arn"]
    executor.adopt(run_b, arn)  # the machine skipped A (no input) and went on to B
    skipped = executor.state("batch_a")
    assert skipped.name == "failed" and "skipped" in (skipped.reason or "")
    assert executor.state("batch_b").name == "running"
    store.write_blob("batches/batch_b/output/_failed.json", [b'{"reason": "CUDA out of memory"}'])
    failed = executor.state("batch_b")
    assert failed.name == "failed" and "CUDA out of memory" in (failed.reason or "")
