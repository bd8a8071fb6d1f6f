"""The tiers' executor: a batch runs in an execution of the stack's nightly state machine.

The state machine is the one `python -m infra.run STACK` starts: it brings up the GPU capacity, runs the job on an
input into an output, and releases the capacity however the run ends. A batch's run gets the batch's own input
and output (`{"batch": {"id", "input_uri", "output_uri", "endpoint"}}`) in place of a night's date, so the job,
its exactly-once resume on the output and its stop (commit what finished, partial files) are the night's.

One execution may run several batches back to back on one GPU boot (the Batch API's queue drain,
infra/statemachines/queue.py): `start` begins an execution when none runs, and a running execution takes the
next queued batch itself (`adopt`, from the scheduler's next_run: this executor is its own `ExecutionChain`). So a
batch's state is its own output's markers first (summary.json, _failed.json), the execution's status only while
its run is open, and `stop` stops the execution only while it is on that batch.

The front is stateless (a Lambda function), so what this executor knows lives in the store:
`batches/<id>/execution.json` holds the execution's ARN and the batch's output (or `busy`: its start found the
GPUs taken, and the scheduler asks again on its next tick), `executions/<name>.json` the run the execution is on,
its runs and the polls they spent. Never two jobs on one GPU group: a start while an execution runs is `busy`,
and so is a start that finds the GPU slot taken: `records/gpu_slot/gpus.json`, a record two ticks (two Lambda
invocations in the same minute) can only take one at a time (the store's compare-and-swap), naming the execution
that holds the GPUs, since listing executions and then starting one is not atomic.

A stopped (ABORTED) execution has not stopped its job yet, and skips its release step: `stop` releases the GPUs
itself (the small tier's group to 0, the EKS tiers' RayJob deleted through the submit function), and the job's
SIGTERM (the node's, or KubeRay's stop of the Ray job) makes it commit what finished and write its partial files,
then `_interrupted.json`. So a stopped run counts as stopped once that note (or a summary or failure) is in its
output, or once the stop bound has passed since the abort (`stop_wait_s`: the stack's, LLM_BATCH_STOP_WAIT_S;
on EKS it also covers a release left to the GPU sweep), never before: the batch then closes with its partial files.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from workload.batch_api.executor import BatchRun, ExecutionChain, RunState
from workload.batch_api.store import Store, StoreConflict
from workload.contract.config import ResumeConfig
from workload.contract.entrypoint import stop_timeout_s

_STATES = {"RUNNING": "running", "PENDING_REDRIVE": "running", "SUCCEEDED": "succeeded", "ABORTED": "stopped"}
SLOT_KIND, SLOT_ID = "gpu_slot", "gpus"
# A slot taken with no execution named yet is a start under way (the tick between its take and its start): past
# this it is a tick that died there, and the slot is free again.
SLOT_START_S = 120
# What a stopped job takes to commit and write its files: its grace period and the run spec's margin.
STOP_WAIT_S = stop_timeout_s(ResumeConfig().grace_period_s)
ENDED_NOTES = ("summary.json", "_failed.json", "_interrupted.json")


def _marker(batch_id: str) -> str:
    return f"batches/{batch_id}/execution.json"


def _execution_marker(execution_arn: str) -> str:
    """What one execution has done: the run it is on (`current`), its runs and the polls they spent."""
    return f"executions/{execution_arn.rsplit(':', 1)[-1]}.json"


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
    release step, so `stop` sets the group to 0 itself once no execution runs (what `infra.run --stop` does).
    `release`: the EKS tiers' counterpart, the nightly submit function's `release` (it deletes the RayJob, so its
    job gets SIGTERM and its grace to write the partial files, and frees the GPU nodes), called the same way;
    without it the GPU sweep does that within its 30 minutes (`stop_wait_s` covers that wait)."""

    def __init__(
        self,
        sfn: Any,
        store: Store,
        state_machine_arn: str,
        capacity: tuple[Any, str] | None = None,
        clock: Callable[[], float] = time.time,
        stop_wait_s: float = STOP_WAIT_S,
        release: Callable[[], None] | None = None,
    ) -> None:
        if not state_machine_arn.startswith("arn:"):
            raise ValueError(f"not a state machine ARN: {state_machine_arn!r}")
        self.sfn, self.store, self.arn, self.capacity = sfn, store, state_machine_arn, capacity
        self.clock, self.stop_wait_s, self.release = clock, stop_wait_s, release

    def _running(self) -> list[dict[str, Any]]:
        pages = self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.arn, statusFilter="RUNNING")
        return [execution for page in pages for execution in page["executions"]]

    def _read(self, key: str) -> dict[str, Any] | None:
        body = self.store.read_blob(key)
        return None if body is None else json.loads(b"".join(body))

    def _write(self, key: str, marker: dict[str, Any]) -> None:
        self.store.write_blob(key, [json.dumps(marker).encode()])

    def _store_key(self, uri: str) -> str | None:
        """`uri` as a key of this store (a batch's output), or None for one outside it."""
        root = self.store.uri("")
        return uri.removeprefix(root) if uri.startswith(root) else None

    def _take_slot(self, run_id: str) -> str | None:
        """Take the GPU slot for `run_id`'s start (compare-and-swap on its record); its version, or None when
        another start holds it: an execution still running, or a start under way for less than SLOT_START_S."""
        found = self.store.get(SLOT_KIND, SLOT_ID)
        if found is not None:
            holder = found.record.get("execution_arn")
            if holder is not None:
                if self.sfn.describe_execution(executionArn=holder)["status"] in ("RUNNING", "PENDING_REDRIVE"):
                    return None
            elif self.clock() < float(found.record["taken_at"]) + SLOT_START_S:
                return None
        slot = {"id": SLOT_ID, "run": run_id, "taken_at": self.clock(), "execution_arn": None}
        try:
            return self.store.put(SLOT_KIND, slot, None if found is None else found.version)
        except StoreConflict:  # another tick took it first
            return None

    def _name_slot(self, version: str, run_id: str, execution_arn: str) -> None:
        slot = {"id": SLOT_ID, "run": run_id, "taken_at": self.clock(), "execution_arn": execution_arn}
        # A conflict: only after SLOT_START_S, and then the execution itself is RUNNING, so occupied() holds.
        with contextlib.suppress(StoreConflict):
            self.store.put(SLOT_KIND, slot, version)

    def _start(self, run_id: str, execution_input: dict[str, Any]) -> str | None:
        """Start an execution for `run_id` if the GPUs are free and the slot is this start's; its ARN, or None."""
        version = self._take_slot(run_id)
        if version is None:
            return None
        started = self.sfn.start_execution(
            stateMachineArn=self.arn, name=self._execution_name(run_id), input=json.dumps(execution_input)
        )
        arn = str(started["executionArn"])
        self._name_slot(version, run_id, arn)
        return arn

    def occupied(self) -> bool:
        """Whether an execution runs: it holds the GPUs and, when its run ends, takes the oldest queued entry
        itself (its NextBatch step, the scheduler's `next_run`), so the tick starts nothing beside it."""
        return bool(self._running())

    def chain(self) -> ExecutionChain:
        """This executor: its executions take the queue's next run themselves."""
        return self

    def execution_input(self, run: BatchRun) -> dict[str, Any]:
        return run_input(run)

    def adopt(self, run: BatchRun, execution_arn: str) -> None:
        """`run` is the next one of the running execution `execution_arn` (claimed by its NextBatch step)."""
        output, source = self._store_key(run.output_uri), self._store_key(run.input_uri)
        self._write(_marker(run.batch_id), {"execution_arn": execution_arn, "output_key": output, "input_key": source})
        self.turn(execution_arn, run.batch_id)

    def turn(self, execution_arn: str, run_id: str) -> None:
        """`run_id` (a batch, or a night of nights.py) is the run the execution is on now: one more of its runs."""
        spent = self._read(_execution_marker(execution_arn)) or {"polls": 0, "runs": 0}
        if spent.get("current") == run_id:  # a retried hand-over (scheduler.next_run): the same run, once
            return
        self._write(_execution_marker(execution_arn), {**spent, "current": run_id, "runs": int(spent["runs"]) + 1})

    def spend(self, execution_arn: str, polls: int) -> int:
        """Add the polls of the run that just ended to the execution's count; the polls it has spent so far."""
        spent = self._read(_execution_marker(execution_arn)) or {"polls": 0, "runs": 0, "current": None}
        spent["polls"] = int(spent["polls"]) + polls
        self._write(_execution_marker(execution_arn), spent)
        return int(spent["polls"])

    def answered(self, execution_arn: str, asked: str | None) -> dict[str, Any] | None:
        """What this execution's NextBatch `asked` (the time it entered the step) was answered, if it was: a
        retry of the step after its answer was lost gets the same run, not a second claim."""
        turn = self._read(_execution_marker(execution_arn)) or {}
        answer = turn.get("answer")
        return answer if asked is not None and turn.get("asked") == asked and isinstance(answer, dict) else None

    def remember(self, execution_arn: str, asked: str | None, answer: dict[str, Any]) -> None:
        turn = self._read(_execution_marker(execution_arn)) or {"polls": 0, "runs": 0, "current": None}
        self._write(_execution_marker(execution_arn), {**turn, "asked": asked, "answer": answer})

    def _execution_name(self, run_id: str) -> str:
        return f"{run_id}-{int(time.time())}"  # names are unique per machine for 90 days: one per start

    def start(self, run: BatchRun) -> None:
        running = self._running()
        mine = [e for e in running if str(e["name"]).startswith(f"{run.batch_id}-")]
        if mine:  # started by an earlier tick whose marker write was lost: follow that one
            self.adopt(run, mine[0]["executionArn"])
            return
        started = None if running else self._start(run.batch_id, run_input(run))
        if started is None:
            names = ", ".join(str(e["name"]) for e in running) or "another start under way"
            self._write(_marker(run.batch_id), {"busy": f"another run holds the GPUs: {names}"})
            return
        self.adopt(run, started)

    def start_night(self, entry_id: str, date: str) -> str | None:
        """Start the night `date` (a queued entry of the schedule's, `nights.py`) as its own execution, the
        schedule's input; its ARN, or None while another execution holds the GPUs (it takes the night itself)."""
        if self._running():
            return None
        started = self._start(entry_id, {"date": date})
        if started is not None:
            self.turn(started, entry_id)
        return started

    def execution_of(self, run_id: str) -> str | None:
        """The latest execution named for `run_id` (`_execution_name`), in any status."""
        pages = self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.arn)
        mine = [e for page in pages for e in page["executions"] if str(e["name"]).startswith(f"{run_id}-")]
        return str(max(mine, key=lambda e: e["startDate"])["executionArn"]) if mine else None

    def state(self, batch_id: str) -> RunState:
        """A batch's own state, also inside an execution shared with other runs: its output's markers say that it
        ended (summary.json: done; _failed.json: failed), the execution's status only how a run still open stands."""
        marker = self._read(_marker(batch_id))
        if marker is None:
            return RunState("absent")
        if "busy" in marker:
            return RunState("busy", str(marker["busy"]))
        output = marker.get("output_key")
        if output is not None and self.store.blob_size(f"{output}/summary.json") is not None:
            return RunState("succeeded")
        if output is not None and self.store.blob_size(f"{output}/_failed.json") is not None:
            return RunState("failed", self._failure(output))
        arn = marker["execution_arn"]
        described = self.sfn.describe_execution(executionArn=arn)
        status = str(described["status"])
        if status == "RUNNING" and output is not None and not self._current(arn, batch_id):
            source = marker.get("input_key")
            if source is None or self.store.blob_size(source) is None:
                # The execution went on to another run without this batch's summary: its input went missing
                # (the machine skipped it, no GPU time spent on it).
                return RunState("failed", f"the run skipped the batch: no input at its file ({arn})")
            return RunState("running")  # handed over, the execution not yet on it (adopt writes this marker first)
        touched = output is not None and bool(self.store.list_blobs(output))
        if status == "SUCCEEDED" and output is not None and not touched:
            # Handed to an execution that ended without starting its job (the hand-over's answer lost and caught):
            # never run, so the scheduler starts it again (or fails it if its input is gone).
            return RunState("absent")
        if status == "SUCCEEDED" and output is not None:
            return RunState("failed", f"the run ended without the batch's summary.json (its input missing?) ({arn})")
        if status == "ABORTED" and touched and not self._stop_committed(output, described):
            return RunState("running")  # stopped: its job is committing what finished and writing its files
        if status in _STATES:
            return RunState(_STATES[status])  # type: ignore[arg-type]
        said = " ".join(str(described.get(field) or "") for field in ("error", "cause")).strip()
        return RunState("failed", f"the run {status.lower()}: {said or 'no cause given'} ({arn})")

    def _stop_committed(self, output: str | None, described: dict[str, Any]) -> bool:
        """Whether a stopped execution's job has written what it will (its note after the partial files), or has
        had its stop's bound since the abort to do so."""
        if output is None or any(self.store.blob_size(f"{output}/{name}") is not None for name in ENDED_NOTES):
            return True
        stopped = described.get("stopDate")
        stopped_s = stopped.timestamp() if isinstance(stopped, datetime) else self.clock()
        return self.clock() >= stopped_s + self.stop_wait_s

    def _failure(self, output: str) -> str:
        said = self._read(f"{output}/_failed.json") or {}
        return f"the job failed: {said.get('reason') or 'no reason given'} ({output}/_failed.json)"

    def _current(self, execution_arn: str, run_id: str) -> bool:
        """Whether `run_id` is the run the execution is on (no execution marker: the only run it has)."""
        turn = self._read(_execution_marker(execution_arn))
        return turn is None or turn.get("current") == run_id

    def stop(self, batch_id: str) -> None:
        """Stop the batch's run: its execution, unless that execution is on another run by now (a batch that
        ended or was passed over stops nothing); the small tier's GPUs are released once no execution runs."""
        marker = self._read(_marker(batch_id))
        if marker is None:
            return
        if "busy" in marker:  # it never started: nothing runs, and `state` says absent from now on
            self.store.delete_blobs(_marker(batch_id))
            return
        arn = marker["execution_arn"]
        output = marker.get("output_key")
        ended = output is not None and any(
            self.store.blob_size(f"{output}/{name}") is not None for name in ("summary.json", "_failed.json")
        )
        mine = not ended and self._current(arn, batch_id)
        stopped = None
        if mine and self.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
            self.sfn.stop_execution(executionArn=arn, cause=f"batch {batch_id} cancelled or expired (Batch API)")
            stopped = arn
        # The execution just stopped may still be listed as running ("This operation is eventually consistent":
        # ListExecutions, AWS Step Functions API reference, read 2026-12-06; moto's too, under load): it does not
        # count, or its GPUs would be left to the sweep.
        if self.capacity is None and self.release is None:  # nothing to release: no listing needed
            return
        if any(e["executionArn"] != stopped for e in self._running()):
            return
        if self.capacity is not None:
            autoscaling, group = self.capacity
            autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0, HonorCooldown=False)
        if self.release is not None:
            self.release()

    def close(self) -> None:
        """Nothing to do: the runs belong to Step Functions, not to this process, and outlive it."""
