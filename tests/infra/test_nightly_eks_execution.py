"""The EKS tiers' nightly state machine executed on moto, driving the real submit function.

moto would run a Lambda function in Docker (absent here); instead its Lambda API is switched to moto's
Docker-free backend and that backend's invoke is pointed at the real handler, run in-process against the
moto server (S3, EKS node groups) and a TLS Kubernetes API stand-in (tests/infra/fake_kube.py). What stands
in for the cluster is the test's own thread, which plays KubeRay and the job: it sees the RayJob the function
created and writes the job's markers, or a RayJob status.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra import statemachines
from infra.functions.submit_rayjob import handler as submit
from tests.infra.fake_kube import FakeKube
from tests.infra.nightly_aws import (
    NIGHT_WITHOUT_INPUT,
    SmallStack,
    create_function,
    create_small_stack,
    create_state_machine,
    executing_state_machines,
    set_lambda_docker,
    summary,
    wait_for,
    wait_for_end,
)
from tests.infra.test_submit_rayjob import CLUSTER, NAMESPACE, NODEGROUP, RAYJOBS, template_for


@pytest.fixture
def eks_stack(
    moto_reset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[SmallStack, FakeKube, str]]:
    """Bucket, alerts, an EKS GPU group at 0, the submit function behind moto's Lambda API, a cluster API."""
    from moto.awslambda_simple.models import LambdaSimpleBackend

    kube = FakeKube(tmp_path)
    with executing_state_machines(moto_reset):
        set_lambda_docker(moto_reset, False)
        try:
            stack = create_small_stack()
            template = tmp_path / "night_template.json"
            template.write_text(json.dumps(template_for("medium", stack.bucket)))
            for key, value in {
                "CLUSTER_NAME": CLUSTER,
                "API_SERVER": kube.url,
                "CLUSTER_CA": base64.b64encode(kube.ca_pem.encode()).decode(),
                "NAMESPACE": NAMESPACE,
                "CAPACITY_MODE": "nodegroup",
                "NODEGROUP": NODEGROUP,
                "GPU_NODES": "2",
                "RAYJOB_TEMPLATE": str(template),
            }.items():
                monkeypatch.setenv(key, value)

            def invoke(self: Any, function_name: str, qualifier: Any, body: Any, *args: Any) -> bytes:
                return json.dumps(submit.handler(json.loads(body))).encode()

            monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
            eks = boto3.client("eks")
            eks.create_cluster(
                name=CLUSTER,
                roleArn="arn:aws:iam::123456789012:role/eks",
                resourcesVpcConfig={"subnetIds": []},
            )
            eks.create_nodegroup(
                clusterName=CLUSTER,
                nodegroupName=NODEGROUP,
                nodeRole="arn:aws:iam::123456789012:role/nodes",
                subnets=["subnet-1"],
                scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 0},
            )
            function_arn = create_function("llm-batch-medium-submit-rayjob", submit.__file__)
            yield stack, kube, function_arn
        finally:
            set_lambda_docker(moto_reset, True)
            kube.stop()


def _start(
    stack: SmallStack,
    function_arn: str,
    night: str = "2026-11-28",
    execution_input: dict[str, Any] | None = None,
    **overrides: int,
) -> str:
    subs = {
        key: value
        for key, value in stack.substitutions(**overrides).items()
        if key not in ("AutoScalingGroup", "RunRequestKey")
    }
    definition = statemachines.render("eks.asl.json", {**subs, "Stack": "medium", "SubmitFunction": function_arn})
    stack.state_machine_arn = create_state_machine("llm-batch-medium-nightly", definition)
    return str(
        boto3.client("stepfunctions").start_execution(
            stateMachineArn=stack.state_machine_arn, input=json.dumps(execution_input or {"date": night})
        )["executionArn"]
    )


def _desired() -> int:
    described = boto3.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName=NODEGROUP)
    return int(described["nodegroup"]["scalingConfig"]["desiredSize"])


class Cluster(threading.Thread):
    """Plays KubeRay and the job for each RayJob the function creates, in turn: `outcomes` says what each does
    (a marker file the job writes, or a RayJob status KubeRay reports)."""

    def __init__(
        self, stack: SmallStack, kube: FakeKube, outcomes: list[tuple[str, Any]], output: str = "output/2026-11-28/"
    ) -> None:
        super().__init__(daemon=True)
        self.stack, self.kube, self.outcomes, self.output = stack, kube, outcomes, output
        self.seen: list[str] = []
        self.entrypoints: list[str] = []
        self.desired_while_running: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for kind, outcome in self.outcomes:
                wait_for(lambda: len(self.kube.names(RAYJOBS)) == 1 and self.kube.names(RAYJOBS)[0] not in self.seen)
                (name,) = self.kube.names(RAYJOBS)
                self.seen.append(name)
                self.entrypoints.append(self.kube.objects[f"{RAYJOBS}/{name}"]["spec"]["entrypoint"])
                self.desired_while_running.append(_desired())
                if kind == "status":
                    self.kube.objects[f"{RAYJOBS}/{name}"]["status"] = outcome
                elif kind == "job":  # the job's own code writes its markers (and may set what KubeRay reports)
                    outcome(self.kube.objects[f"{RAYJOBS}/{name}"])
                else:
                    boto3.client("s3").put_object(
                        Bucket=self.stack.bucket,
                        Key=kind if "/" in kind else f"{self.output}{kind}",  # a whole key: that run's output
                        Body=json.dumps(outcome).encode(),
                    )
        except BaseException as error:  # surfaced by the test through .error
            self.error = error


def test_a_night_on_eks_submits_follows_and_releases(eks_stack: tuple[SmallStack, FakeKube, str]) -> None:
    stack, kube, function_arn = eks_stack
    cluster = Cluster(stack, kube, [("summary.json", summary())])
    cluster.start()
    result = wait_for_end(_start(stack, function_arn))
    cluster.join(timeout=5)
    assert cluster.error is None
    assert result["status"] == "SUCCEEDED", result
    assert cluster.seen == ["llm-batch-20261128-a1"]
    assert cluster.desired_while_running == [2], "capacity_up set the GPU group to its run size"
    assert kube.names(RAYJOBS) == [] and _desired() == 0, "released: RayJob deleted, GPU group at 0"
    assert json.loads(result["output"])["attempts"] == 1


def test_a_rayjob_lost_to_the_platform_is_resubmitted_on_the_same_output(
    eks_stack: tuple[SmallStack, FakeKube, str],
) -> None:
    stack, kube, function_arn = eks_stack
    lost = {"jobDeploymentStatus": "Failed", "reason": "SubmissionFailed", "message": "head pod evicted"}
    cluster = Cluster(stack, kube, [("status", lost), ("summary.json", summary())])
    cluster.start()
    result = wait_for_end(_start(stack, function_arn))
    cluster.join(timeout=5)
    assert cluster.error is None
    assert result["status"] == "SUCCEEDED", result
    assert cluster.seen == ["llm-batch-20261128-a1", "llm-batch-20261128-a2"]
    assert json.loads(result["output"])["attempts"] == 2
    assert kube.names(RAYJOBS) == [] and _desired() == 0


def test_a_failed_job_on_eks_releases_and_alerts(eks_stack: tuple[SmallStack, FakeKube, str]) -> None:
    stack, kube, function_arn = eks_stack
    failed = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "reason": "AppFailed",
        "message": "exit 1",
    }
    cluster = Cluster(stack, kube, [("status", failed)])
    cluster.start()
    result = wait_for_end(_start(stack, function_arn))
    assert result["status"] == "FAILED"
    cause = json.loads(result["cause"])
    assert cause["Error"] == "RayJobFailed" and "AppFailed" in cause["Cause"]
    assert kube.names(RAYJOBS) == [] and _desired() == 0
    (alert,) = stack.alerts()
    assert "RayJobFailed" in alert and "released" in alert


def test_a_refused_job_on_eks_is_a_named_failure_at_once(eks_stack: tuple[SmallStack, FakeKube, str]) -> None:
    """The job refuses the night's output (exit 3: its settings or input changed since the output was begun) and
    names what changed in `_failed.json`, as run_job does (tests/workload/test_resume_guards.py runs the real
    refusal). KubeRay then retries the RayJob on a fresh cluster (its backoffLimit: the RayJob shows as being
    initialised again, not failed); the machine does not wait for that retry to refuse again: its next poll reads the
    marker, ends the run as JobFailed with the refusal's words, submits no other RayJob, deletes this one (which
    ends KubeRay's retries) and releases the GPU group (issue 59, finding 1)."""
    from workload.job.output import OutputStore

    stack, kube, function_arn = eks_stack
    refusal = (
        f"s3://{stack.bucket}/output/2026-11-28 holds output made with other settings: engine.max_model_len "
        "changed. Use a new output URI, or --restart (resume.mode=restart) to delete the old output first."
    )

    def refuse(rayjob: dict[str, Any]) -> None:
        OutputStore(f"s3://{stack.bucket}/output/2026-11-28").write_failure("OutputMismatchError", refusal)
        # KubeRay's checkBackoffLimitAndUpdateStatusIfNeeded: a failed job under its backoffLimit is Retrying, then
        # New and Initializing again on a new cluster, its job status reset (ray-operator/controllers/ray/
        # rayjob_controller.go, ray-project/kuberay at 0057210, read 2026-12-06).
        rayjob["status"] = {"jobDeploymentStatus": "Initializing", "jobStatus": "", "failed": 1}

    cluster = Cluster(stack, kube, [("job", refuse)])
    cluster.start()
    result = wait_for_end(_start(stack, function_arn))
    cluster.join(timeout=5)
    assert cluster.error is None
    assert result["status"] == "FAILED", result
    cause = json.loads(result["cause"])
    assert cause["Error"] == "JobFailed" and "engine.max_model_len changed" in cause["Cause"], cause
    assert "OutputMismatchError" in cause["Cause"] and "_failed.json" in cause["Cause"], cause
    assert cluster.seen == ["llm-batch-20261128-a1"], "no second RayJob: a refusal is not retried"
    assert kube.names(RAYJOBS) == [] and _desired() == 0, "released: the RayJob (and KubeRay's retry) deleted"
    (alert,) = stack.alerts()
    assert "JobFailed" in alert and "engine.max_model_len changed" in alert


def test_a_night_without_input_on_eks_submits_nothing(eks_stack: tuple[SmallStack, FakeKube, str]) -> None:
    stack, kube, function_arn = eks_stack
    result = wait_for_end(_start(stack, function_arn, night=NIGHT_WITHOUT_INPUT))
    assert result["status"] == "SUCCEEDED", result
    assert json.loads(result["output"])["status"] == "skipped"
    assert kube.names(RAYJOBS) == [] and _desired() == 0, "no RayJob, GPU group never raised"
    (alert,) = stack.alerts()
    assert "skipped" in alert and NIGHT_WITHOUT_INPUT in alert


def test_two_queued_batches_on_eks_run_in_one_execution_on_the_same_nodes(
    eks_stack: tuple[SmallStack, FakeKube, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches on EKS through the executor and the queue drain: each RayJob is the batch's (named for it, its
    entrypoint on the batch's file and output, from PlanBatch's `$.batch`); the machine's NextBatch invokes the
    real tick function (in-process, as the submit function is), so the second batch's RayJob is submitted by the
    same execution with no release between the two (the GPU nodes stay), and the nodes are released once."""
    from moto.awslambda_simple.models import LambdaSimpleBackend

    from infra.statemachines.queue import with_queue
    from tests.infra.test_nightly_queue_execution import _batches
    from workload.batch_api import lambda_front

    stack, kube, function_arn = eks_stack
    tick_arn = create_function("llm-batch-medium-batch-api-tick", lambda_front.__file__)
    subs = {k: v for k, v in stack.substitutions().items() if k not in ("AutoScalingGroup", "RunRequestKey")}
    definition = statemachines.render("eks.asl.json", {**subs, "Stack": "medium", "SubmitFunction": function_arn})
    queue = {"TickFunction": tick_arn, "MaxPolls": 30, "QueuePollBudget": 100}
    stack.state_machine_arn = create_state_machine("llm-batch-medium-nightly", with_queue(definition, queue, 600))
    env = {
        "LLM_BATCH_BUCKET": stack.bucket,
        "LLM_BATCH_STATE_MACHINE_ARN": stack.state_machine_arn,
        "LLM_BATCH_MODEL": "Qwen/Qwen3-0.6B",
        "LLM_BATCH_STACK": "medium",
        "LLM_BATCH_METRICS_NAMESPACE": "LLMBatch",
    }
    service = lambda_front.build_service(env)
    monkeypatch.setattr(lambda_front, "_built", {"service": service, "metrics": lambda_front.build_metrics(env)})
    actions: list[str] = []

    def invoke(self: Any, function_name: str, qualifier: Any, body: Any, *args: Any) -> bytes:
        event = json.loads(body)
        if "batch-api-tick" in function_name:
            return json.dumps(lambda_front.tick(event, None)).encode()
        actions.append(event["action"])
        return json.dumps(submit.handler(event)).encode()

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
    first, second = _batches(service, 2)
    done = [(f"batch-api/batches/{batch}/output/summary.json", summary(rows=1)) for batch in (first, second)]
    cluster = Cluster(stack, kube, done)
    cluster.start()
    service.tick()
    sfn = boto3.client("stepfunctions")
    (execution,) = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    result = wait_for_end(execution["executionArn"])
    cluster.join(timeout=5)
    assert cluster.error is None
    assert result["status"] == "SUCCEEDED", result
    assert cluster.seen == [f"llm-batch-{b.replace('_', '-')}-a1" for b in (first, second)]
    s3_uri = f"s3://{stack.bucket}/batch-api/"
    file_key = service.get_batch("project", second)["input_file_id"]
    assert cluster.entrypoints[1].endswith(
        f"--input {s3_uri}files/{file_key}.jsonl --output {s3_uri}batches/{second}/output --no-image-prefix"
    )
    assert actions.count("release") == 1 and actions[-1] == "release", actions
    assert cluster.desired_while_running == [2, 2]
    assert len(sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]) == 1
    assert kube.names(RAYJOBS) == [] and _desired() == 0
    service.tick()
    assert [service.get_batch("project", b)["status"] for b in (first, second)] == ["completed", "completed"]


def test_a_cancel_on_eks_releases_the_rayjob_at_once_and_closes_with_the_partial_files(
    eks_stack: tuple[SmallStack, FakeKube, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel stops the execution, which then skips its release step: the front invokes the submit function's
    `release` itself (LLM_BATCH_RELEASE_FUNCTION, as the small tier's front sets its GPU group to 0), so the RayJob
    is deleted at once rather than at the GPU sweep, up to 30 minutes on. Its job then gets SIGTERM (KubeRay's stop
    and the pods' grace), commits what finished and writes its partial files and `_interrupted.json`; the batch,
    `cancelling` until then, closes with them (issue 59, finding 6)."""
    from moto.awslambda_simple.models import LambdaSimpleBackend

    from tests.infra.test_nightly_queue_execution import _batches
    from workload.batch_api import lambda_front
    from workload.job.output import OutputStore

    stack, kube, function_arn = eks_stack
    subs = {k: v for k, v in stack.substitutions().items() if k not in ("AutoScalingGroup", "RunRequestKey")}
    definition = statemachines.render("eks.asl.json", {**subs, "Stack": "medium", "SubmitFunction": function_arn})
    stack.state_machine_arn = create_state_machine("llm-batch-medium-nightly", definition)
    env = {
        "LLM_BATCH_BUCKET": stack.bucket,
        "LLM_BATCH_STATE_MACHINE_ARN": stack.state_machine_arn,
        "LLM_BATCH_MODEL": "Qwen/Qwen3-0.6B",
        "LLM_BATCH_RELEASE_FUNCTION": function_arn,
    }
    service = lambda_front.build_service(env)
    actions: list[str] = []

    def invoke(self: Any, function_name: str, qualifier: Any, body: Any, *args: Any) -> bytes:
        event = json.loads(body)
        actions.append(event["action"])
        return json.dumps(submit.handler(event)).encode()

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
    (batch,) = _batches(service, 1)
    output = f"s3://{stack.bucket}/batch-api/batches/{batch}/output"

    def stopped_by_sigterm(rayjob: dict[str, Any]) -> None:
        name = rayjob["metadata"]["name"]
        wait_for(lambda: name not in kube.names(RAYJOBS), what="the RayJob's deletion (the job's SIGTERM)")
        answer = {"id": "r1", "custom_id": "a", "response": {"status_code": 200, "body": {}}, "error": None}
        boto3.client("s3").put_object(
            Bucket=stack.bucket, Key=f"batch-api/batches/{batch}/output/output.jsonl", Body=json.dumps(answer) + "\n"
        )
        OutputStore(output).write_interrupted("SIGTERM", 1)

    cluster = Cluster(stack, kube, [("job", stopped_by_sigterm)])
    cluster.start()
    service.tick()
    wait_for(lambda: bool(cluster.seen), what="the batch's RayJob")
    assert service.cancel_batch("project", batch)["status"] == "cancelling"
    assert "release" in actions and kube.names(RAYJOBS) == [] and _desired() == 0, actions
    cluster.join(timeout=30)
    assert cluster.error is None
    service.tick()
    closed = service.get_batch("project", batch)
    assert closed["status"] == "cancelled" and closed["output_file_id"] is not None, closed
