"""The tiers' executor: a batch runs as one execution of the stack's nightly state machine.

The state machine is the one `python -m infra.run STACK` starts: it brings up the GPU capacity, runs the job on an
input into an output, and releases the capacity however the run ends. A batch's execution gets the batch's own
input and output (`{"batch": {"id", "input_uri", "output_uri", "endpoint"}}`) in place of a night's date, so the
job, its exactly-once resume on the output and its stop (commit what finished, partial files) are the night's.

The front is stateless (a Lambda function), so what this executor knows lives in the store beside the batch:
`batches/<id>/execution.json` holds the execution's ARN, or `busy` while another execution holds the GPUs.
One execution at a time: a night's queue runs back to back, and never two jobs on one GPU group; a batch whose
turn comes while another execution runs (the night's date, or a run an operator started) is `busy`, and the
lifecycle asks again on its next tick.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from workload.batch_api.executor import BatchRun, RunState
from workload.batch_api.store import Store

_STATES = {"RUNNING": "running", "PENDING_REDRIVE": "running", "SUCCEEDED": "succeeded", "ABORTED": "stopped"}


def _marker(batch_id: str) -> str:
    return f"batches/{batch_id}/execution.json"


def _key(uri: str) -> str:
    """The object key of an s3:// URI in the stack's bucket (the state machine lists and reads by key)."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    return uri[5:].split("/", 1)[1]


def run_input(run: BatchRun, today: str | None = None) -> dict[str, Any]:
    """The execution's input for one batch (the state machine's `$.batch`, its PlanBatch state): the keys
    beside the URIs because ASL has no URI parsing, and the start's UTC date for the run's logs and markers."""
    batch = {
        "id": run.batch_id,
        "date": today or datetime.now(UTC).date().isoformat(),
        "input_uri": run.input_uri,
        "input_key": _key(run.input_uri),
        "output_uri": run.output_uri,
        "output_key": _key(run.output_uri),
        "endpoint": run.endpoint,
    }
    return {"batch": batch}


class StepFunctionsExecutor:
    """`capacity`: (an autoscaling client, the small tier's GPU group): a stopped execution skips the machine's
    release step, so `stop` sets the group to 0 itself once no execution runs (what `infra.run --stop` does)."""

    def __init__(self, sfn: Any, store: Store, state_machine_arn: str, capacity: tuple[Any, str] | None = None) -> None:
        if not state_machine_arn.startswith("arn:"):
            raise ValueError(f"not a state machine ARN: {state_machine_arn!r}")
        self.sfn, self.store, self.arn, self.capacity = sfn, store, state_machine_arn, capacity

    def _running(self) -> list[dict[str, Any]]:
        pages = self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.arn, statusFilter="RUNNING")
        return [execution for page in pages for execution in page["executions"]]

    def _read(self, batch_id: str) -> dict[str, Any] | None:
        body = self.store.read_blob(_marker(batch_id))
        return None if body is None else json.loads(b"".join(body))

    def _write(self, batch_id: str, marker: dict[str, Any]) -> None:
        self.store.write_blob(_marker(batch_id), [json.dumps(marker).encode()])

    def start(self, run: BatchRun) -> None:
        running = self._running()
        mine = [e for e in running if str(e["name"]).startswith(f"{run.batch_id}-")]
        if mine:  # started by an earlier tick whose marker write was lost: follow that one
            self._write(run.batch_id, {"execution_arn": mine[0]["executionArn"]})
            return
        if running:
            names = ", ".join(str(e["name"]) for e in running)
            self._write(run.batch_id, {"busy": f"another run holds the GPUs: {names}"})
            return
        name = f"{run.batch_id}-{int(time.time())}"  # names are unique per machine for 90 days: one per start
        started = self.sfn.start_execution(stateMachineArn=self.arn, name=name, input=json.dumps(run_input(run)))
        self._write(run.batch_id, {"execution_arn": started["executionArn"]})

    def state(self, batch_id: str) -> RunState:
        marker = self._read(batch_id)
        if marker is None:
            return RunState("absent")
        if "busy" in marker:
            return RunState("busy", str(marker["busy"]))
        described = self.sfn.describe_execution(executionArn=marker["execution_arn"])
        status = str(described["status"])
        if status in _STATES:
            return RunState(_STATES[status])  # type: ignore[arg-type]
        said = " ".join(str(described.get(field) or "") for field in ("error", "cause")).strip()
        return RunState("failed", f"the run {status.lower()}: {said or 'no cause given'} ({marker['execution_arn']})")

    def stop(self, batch_id: str) -> None:
        marker = self._read(batch_id)
        if marker is None:
            return
        if "busy" in marker:  # it never started: nothing runs, and `state` says absent from now on
            self.store.delete_blobs(_marker(batch_id))
            return
        arn = marker["execution_arn"]
        if self.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
            self.sfn.stop_execution(executionArn=arn, cause=f"batch {batch_id} cancelled or expired (Batch API)")
        if self.capacity is not None and not self._running():
            autoscaling, group = self.capacity
            autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0, HonorCooldown=False)

    def close(self) -> None:
        """Nothing to do: the runs belong to Step Functions, not to this process, and outlive it."""
