"""Start the nightly run now: `python -m infra.run STACK [--date YYYY-MM-DD] [--outputs FILE] [--wait]`.

`--batch ID` starts one queued batch of the Batch API now instead (through the stack's Batch API function).

It starts the stack's nightly state machine, which brings up the GPU capacity, runs the job on
input/<date>/ into output/<date>/ and releases the capacity however the run ends. Running a date again
resumes its output: only what is missing is computed. `--stop` stops a run that is going: its executions
end, the small tier's GPU group goes to 0 at once, and the GPU sweep (every 30 minutes) releases the EKS
tiers' GPU nodes; the committed shards stay, so running the date again resumes it.

A night runs only on input marked ready: the uploader writes `<input prefix>_READY` (an empty object) after its
last file (docs/resume.md). The state machine skips a night without it; this command refuses to start one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, date, datetime
from typing import Any

from botocore.exceptions import ClientError

from infra.ops.stack_outputs import OutputsError, boto_session, load_outputs, require

STATE_MACHINE_OUTPUT = "nightly_state_machine_arn"
# The Batch API's schedule function (infra/components/batch_api.py): its queue, its executor.
BATCH_FUNCTION_OUTPUT = "batch_api_tick_function_name"


class RunError(RuntimeError):
    pass


def run_date(value: str | None) -> str:
    if value is None:
        return datetime.now(UTC).date().isoformat()
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError as error:
        raise RunError(f"--date must be YYYY-MM-DD, got {value!r}") from error


READY = "_READY"


def ready_key(sfn: Any, state_machine_arn: str, night: str) -> str:
    """The key of the night's ready marker, as the deployed state machine computes it (its PlanRun state)."""
    definition = json.loads(sfn.describe_state_machine(stateMachineArn=state_machine_arn)["definition"])
    expression = str(definition["States"]["PlanRun"]["Parameters"]["ready_key.$"])
    template = expression.split("'")[1]  # States.Format('input/{}/_READY', $.date)
    return template.replace("{}", night)


def check_ready(outputs: dict[str, Any], night: str) -> None:
    """Raise RunError unless the night's input is marked ready (the uploader's last write)."""
    arn, bucket = require(outputs, STATE_MACHINE_OUTPUT, "data_bucket")
    session = boto_session(outputs)
    key = ready_key(session.client("stepfunctions"), arn, night)
    listed = session.client("s3").list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    if not any(item["Key"] == key for item in listed.get("Contents", [])):
        folder = key.removesuffix(READY)
        raise RunError(
            f"s3://{bucket}/{key} is missing: the input of {night} is absent or its upload has not finished. "
            f"Upload every file under s3://{bucket}/{folder}, then mark it ready: "
            f"aws s3api put-object --bucket {bucket} --key {key}"
        )


def start_run(
    outputs: dict[str, Any], night: str, *, allow_concurrent: bool = False, require_ready: bool = False
) -> str:
    """Start an execution for `night`; refuses while another one runs (two runs would share the GPUs), and with
    `require_ready` when the night's input is not marked ready."""
    (arn,) = require(outputs, STATE_MACHINE_OUTPUT)
    sfn = boto_session(outputs).client("stepfunctions")
    running = sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING", maxResults=10)["executions"]
    if running and not allow_concurrent:
        names = ", ".join(execution["name"] for execution in running)
        raise RunError(f"a nightly run is already going ({names}); wait for it or stop it first")
    if require_ready:
        check_ready(outputs, night)
    name = f"manual-{night}-{datetime.now(UTC):%H%M%S}"
    started = sfn.start_execution(stateMachineArn=arn, name=name, input=json.dumps({"date": night}))
    return str(started["executionArn"])


def start_batch(outputs: dict[str, Any], batch_id: str, lambda_client: Any = None) -> str:
    """Start one queued batch of the Batch API now, through the stack's own tick function: the queue's start and
    executor, so the batch's record and execution stay one story (no second path that could disagree)."""
    if not batch_id.startswith("batch_"):
        raise RunError(f"--batch takes a Batch API batch id (batch_...), got {batch_id!r}")
    if not outputs.get(BATCH_FUNCTION_OUTPUT):
        raise RunError(f"the stack has no Batch API (no {BATCH_FUNCTION_OUTPUT} output): set batch_api.enabled")
    client = lambda_client or boto_session(outputs).client("lambda")
    try:
        answer = client.invoke(
            FunctionName=outputs[BATCH_FUNCTION_OUTPUT], Payload=json.dumps({"start_batch": batch_id}).encode()
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "TooManyRequestsException":
            raise
        # The tick's reserved concurrency (batch_api.tick_reserved_concurrency): another tick holds it, and
        # botocore's own retries did not outlast it. Nothing started; the queue still holds the batch.
        raise RunError(
            f"batch {batch_id} did not start: the tick function is busy with another tick (its reserved "
            "concurrency, batch_api.tick_reserved_concurrency); run this again in a minute, or let the next "
            "scheduled tick start the queue's oldest batch"
        ) from error
    body = json.loads(answer["Payload"].read() or b"{}")
    if answer.get("FunctionError") or "error" in body:
        raise RunError(f"batch {batch_id} did not start: {body.get('error') or body.get('errorMessage') or body}")
    return str(body["status"])


def current_step(sfn: Any, execution_arn: str) -> str | None:
    """The state the execution entered last (e.g. WaitForJob), from its history; None when not known yet."""
    events = sfn.get_execution_history(executionArn=execution_arn, reverseOrder=True, maxResults=20)["events"]
    for event in events:
        entered = event.get("stateEnteredEventDetails")
        if entered:
            return str(entered["name"])
    return None


def wait(outputs: dict[str, Any], execution_arn: str, poll_s: float = 30.0, progress: Any = None) -> dict[str, Any]:
    """Poll until the execution ends; each poll reports the elapsed time and the step it is in to `progress`."""
    sfn = boto_session(outputs).client("stepfunctions")
    started = time.monotonic()
    last = None
    while True:
        described: dict[str, Any] = sfn.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        step = current_step(sfn, execution_arn)
        if progress is not None and step != last:
            progress(f"  {time.monotonic() - started:6.0f} s  {step or 'starting'}")
            last = step
        time.sleep(poll_s)


def stop_runs(outputs: dict[str, Any]) -> list[str]:
    """Stop every running execution of the nightly run; the small tier's GPU group goes to 0 at once."""
    (arn,) = require(outputs, STATE_MACHINE_OUTPUT)
    session = boto_session(outputs)
    sfn = session.client("stepfunctions")
    running = sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING", maxResults=100)["executions"]
    for execution in running:
        sfn.stop_execution(executionArn=execution["executionArn"], cause="stopped by the operator (infra.run --stop)")
    if outputs.get("gpu_group_name"):
        # The state machine's release step does not run for a stopped execution; do its work for the small tier.
        session.client("autoscaling").set_desired_capacity(
            AutoScalingGroupName=outputs["gpu_group_name"], DesiredCapacity=0, HonorCooldown=False
        )
    return [str(execution["name"]) for execution in running]


def main(argv: list[str] | None = None) -> int:
    from workload.contract.cli_errors import HELP_EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m infra.run",
        description=__doc__.splitlines()[0],
        epilog="examples: python -m infra.run small --wait; python -m infra.run small --date 2026-11-28; "
        f"python -m infra.run small --stop. {HELP_EPILOG}",
    )
    parser.add_argument("stack", help="the Pulumi stack (small, medium, large)")
    parser.add_argument("--date", help="the night to run (YYYY-MM-DD); default: today (UTC)")
    parser.add_argument("--outputs", help="saved `pulumi stack output --json` instead of calling pulumi")
    parser.add_argument("--wait", action="store_true", help="wait for the run to end; exit 1 if it failed")
    parser.add_argument("--poll", type=float, default=30.0, help="seconds between checks with --wait")
    parser.add_argument("--stop", action="store_true", help="stop the run that is going and release its GPUs")
    parser.add_argument("--batch", help="start this queued Batch API batch (batch_...) now, ahead of its turn")
    args = parser.parse_args(argv)
    if args.batch:
        try:
            state = start_batch(load_outputs(args.stack, args.outputs), args.batch)
        except (OutputsError, RunError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"batch {args.batch}: {state}; follow it with: python -m infra.status {args.stack}")
        return 0
    if args.stop:
        stopped = stop_runs(load_outputs(args.stack, args.outputs))
        print(f"stopped: {', '.join(stopped)}" if stopped else f"no run of {args.stack} is going")
        return 0
    try:
        outputs = load_outputs(args.stack, args.outputs)
        night = run_date(args.date)
        execution_arn = start_run(outputs, night, require_ready=True)
    except (OutputsError, RunError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"started the nightly run of {args.stack} for {night}: {execution_arn}")
    print(f"follow it with: python -m infra.status {args.stack}")
    if not args.wait:
        return 0
    print("waiting (elapsed, current step):")
    ended = wait(outputs, execution_arn, args.poll, progress=lambda line: print(line, flush=True))
    print(f"{ended['status']}: {ended.get('cause') or ended.get('output') or ''}")
    return 0 if ended["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
