"""A night's queue on one GPU boot: the small tier's machine, rendered with the Batch API's queue drain, executed
by a real moto server, its NextBatch step invoking the real tick function (lambda_front.tick) in-process behind
moto's Lambda API (moto would run a function in Docker, absent here), over the stack's bucket and machine.

What stands in is the instance (no instance boots in moto): `QueueNode` plays one boot of the small tier's node
holding on for the next run request (infra/components/user_data.py), writing each run's summary as the job would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import boto3
import pytest

from infra import statemachines
from infra.statemachines.queue import with_queue
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
from tests.workload.test_batch_api import _line
from workload.batch_api import lambda_front
from workload.batch_api.service import BatchService

TICK = "llm-batch-small-batch-api-tick"


@pytest.fixture
def queued_stack(moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SmallStack, BatchService]]:
    """The small stack's bucket, GPU group and alerts; its nightly machine with the queue drain; the tick
    function behind moto's Lambda API; the Batch API's service over the same bucket and machine."""
    from moto.awslambda_simple.models import LambdaSimpleBackend

    with executing_state_machines(moto_reset):
        set_lambda_docker(moto_reset, False)
        try:
            stack = create_small_stack()
            tick_arn = create_function(TICK, lambda_front.__file__)
            queue = {"TickFunction": tick_arn, "MaxPolls": 30, "QueuePollBudget": 100}
            definition = with_queue(statemachines.render("small.asl.json", stack.substitutions()), queue, 600)
            stack.state_machine_arn = create_state_machine("llm-batch-small-nightly", definition)
            env = {
                "LLM_BATCH_BUCKET": stack.bucket,
                "LLM_BATCH_STATE_MACHINE_ARN": stack.state_machine_arn,
                "LLM_BATCH_MODEL": "Qwen/Qwen3-0.6B",
                "LLM_BATCH_STACK": "small",
                "LLM_BATCH_METRICS_NAMESPACE": "LLMBatch",
                "LLM_BATCH_GPU_GROUP": stack.asg,
            }
            service = lambda_front.build_service(env)
            monkeypatch.setattr(
                lambda_front, "_built", {"service": service, "metrics": lambda_front.build_metrics(env)}
            )

            def invoke(self: Any, function_name: str, qualifier: Any, body: Any, *args: Any) -> bytes:
                assert function_name in (TICK, tick_arn), function_name
                return json.dumps(lambda_front.tick(json.loads(body), None)).encode()

            monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
            yield stack, service
        finally:
            set_lambda_docker(moto_reset, True)


class QueueNode(threading.Thread):
    """One boot of the GPU node: up once the group is 1, it runs each new run request (another batch id or date
    than the last) and writes that run's summary, until `runs` are done; meanwhile it samples the group's
    desired capacity, so a release and a second boot between runs would show."""

    def __init__(self, stack: SmallStack, runs: int) -> None:
        super().__init__(daemon=True)
        self.stack, self.runs = stack, runs
        self.requests: list[dict[str, Any]] = []
        self.capacity: list[int] = [0]
        self.error: BaseException | None = None
        self.done = threading.Event()

    def _sample(self) -> bool:
        value = self.stack.desired_capacity()
        if value != self.capacity[-1]:
            self.capacity.append(value)
        return self.done.is_set()

    def run(self) -> None:
        try:
            s3 = boto3.client("s3")
            seen: set[str] = set()
            for _ in range(self.runs):

                def new_request() -> bool:
                    self._sample()
                    listed = s3.list_objects_v2(Bucket=self.stack.bucket, Prefix="control/run.json")
                    if self.stack.desired_capacity() != 1 or not listed["KeyCount"]:
                        return False
                    body = s3.get_object(Bucket=self.stack.bucket, Key="control/run.json")["Body"].read()
                    request = json.loads(body)
                    if request["output_uri"] in seen:
                        return False
                    self.requests.append(request)
                    return True

                wait_for(new_request, what="the next run request")
                request = self.requests[-1]
                seen.add(request["output_uri"])
                key = urlparse(request["output_uri"]).path.strip("/") + "/summary.json"
                s3.put_object(Bucket=self.stack.bucket, Key=key, Body=json.dumps(summary(rows=1)).encode())
            wait_for(lambda: self._sample() or self.capacity[-1] == 0, what="the group released")
        except BaseException as error:  # surfaced by the test through .error
            self.error = error


def _batches(service: BatchService, count: int) -> list[str]:
    file_id = service.upload_file("project", "in.jsonl", "batch", [_line("a").encode()])["id"]
    return [service.create_batch("project", file_id, "/v1/chat/completions", "24h")["id"] for _ in range(count)]


def _executions(stack: SmallStack) -> list[dict[str, Any]]:
    return list(boto3.client("stepfunctions").list_executions(stateMachineArn=stack.state_machine_arn)["executions"])


def test_a_nights_queue_runs_in_one_execution_on_one_boot(queued_stack: tuple[SmallStack, BatchService]) -> None:
    """Two queued batches, then the schedule's night (`{"enqueue_night": ...}`, twice: its retry) and a night
    without input, all while the first batch runs: ONE execution, ONE boot, the GPU released once after the
    last run. The night runs by its date path (input/<date>/ -> output/<date>/), the empty night is skipped."""
    stack, service = queued_stack
    first, second = _batches(service, 2)
    node = QueueNode(stack, runs=3)
    node.start()
    service.tick()  # nothing runs: the oldest starts an execution, booting the GPU
    assert service.get_batch("project", second)["status"] == "validating"
    (execution,) = _executions(stack)
    service.tick()  # the execution holds the GPU: the tick starts nothing beside it
    queued = {"status": "queued", "night": "night-2026-11-28"}
    assert lambda_front.tick({"enqueue_night": "2026-11-28T01:00:00Z"}, None) == queued
    assert lambda_front.tick({"enqueue_night": "2026-11-28T01:00:00Z"}, None) == queued  # one entry a night
    lambda_front.tick({"enqueue_night": f"{NIGHT_WITHOUT_INPUT}T01:00:00Z"}, None)
    assert len(_executions(stack)) == 1, "the nights wait for the running execution"
    result = wait_for_end(execution["executionArn"])
    node.join(timeout=30)
    assert node.error is None
    assert result["status"] == "SUCCEEDED", result
    assert [r.get("batch_id") for r in node.requests] == [first, second, None]
    assert node.requests[1]["output_uri"].endswith(f"batch-api/batches/{second}/output")
    assert node.requests[2]["output_uri"] == f"s3://{stack.bucket}/output/2026-11-28/"
    assert json.loads(result["output"])["status"] == "skipped"  # the last run: the night without input
    assert node.capacity == [0, 1, 0], "one boot, released once, never in between"
    assert len(_executions(stack)) == 1
    service.tick()
    assert [service.get_batch("project", b)["status"] for b in (first, second)] == ["completed", "completed"]
    assert {r["id"]: r["status"] for r in service.store.records("night")} == {
        "night-2026-11-28": "started",
        f"night-{NIGHT_WITHOUT_INPUT}": "started",
    }
    assert {b["id"] for b in service.list_batches("project", None, 100)["data"]} == {first, second}  # no nights
    (alert,) = stack.alerts()
    assert "skipped" in alert and NIGHT_WITHOUT_INPUT in alert


def _seconds(duration: str) -> int:
    """A Kubernetes-style duration ('300s', '5m', '1h30m') in seconds."""
    import re

    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


@pytest.mark.parametrize("tier", ["medium", "large"])
def test_on_eks_the_next_rayjob_comes_before_the_gpu_nodes_are_taken_away(tier: str) -> None:
    """Between two runs of a queue the GPU nodes sit without the last run's pods until the next RayJob: at most
    one poll of the machine (it sees the summary), the NextBatch and S3 steps (the margin) and the submit
    function's own bound. That must be shorter than the idle time after which the nodes go: Karpenter's
    consolidateAfter (large) and the Cluster Autoscaler's scale-down-unneeded-time (medium's managed group)."""
    from infra.components.cluster_autoscaler import ClusterAutoscalerArgs
    from infra.components.nightly import SUBMIT_TIMEOUT_S
    from infra.config import load_stack_config
    from infra.statemachines import timing

    config = load_stack_config(tier, {"cost_center": "cc"})
    gap = timing.poll_seconds(config.schedule.run_deadline_minutes) + timing.NEXT_RUN_MARGIN_S + SUBMIT_TIMEOUT_S
    if config.eks.karpenter_enabled:
        idle = _seconds(config.eks.node_pool.consolidate_after)
    else:
        idle = _seconds(ClusterAutoscalerArgs.__dataclass_fields__["scale_down_after"].default)
    assert gap < idle, f"{tier}: the next RayJob may come {gap} s after the last, the nodes go after {idle} s idle"
