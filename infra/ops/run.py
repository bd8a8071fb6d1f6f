"""Start the nightly run now: `python -m infra.run STACK [--date YYYY-MM-DD] [--outputs FILE] [--wait]`.

It starts the stack's nightly state machine, which brings up the GPU capacity, runs the job on
input/<date>/ into output/<date>/ and releases the capacity however the run ends. Running a date again
resumes its output: only what is missing is computed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, date, datetime
from typing import Any

from infra.ops.stack_outputs import OutputsError, boto_session, load_outputs, require

STATE_MACHINE_OUTPUT = "nightly_state_machine_arn"


class RunError(RuntimeError):
    pass


def run_date(value: str | None) -> str:
    if value is None:
        return datetime.now(UTC).date().isoformat()
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError as error:
        raise RunError(f"--date must be YYYY-MM-DD, got {value!r}") from error


def start_run(outputs: dict[str, Any], night: str, *, allow_concurrent: bool = False) -> str:
    """Start an execution for `night`; refuses while another one runs (two runs would share the GPUs)."""
    (arn,) = require(outputs, STATE_MACHINE_OUTPUT)
    sfn = boto_session(outputs).client("stepfunctions")
    running = sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING", maxResults=10)["executions"]
    if running and not allow_concurrent:
        names = ", ".join(execution["name"] for execution in running)
        raise RunError(f"a nightly run is already going ({names}); wait for it or stop it first")
    name = f"manual-{night}-{datetime.now(UTC):%H%M%S}"
    started = sfn.start_execution(stateMachineArn=arn, name=name, input=json.dumps({"date": night}))
    return str(started["executionArn"])


def wait(outputs: dict[str, Any], execution_arn: str, poll_s: float = 30.0) -> dict[str, Any]:
    sfn = boto_session(outputs).client("stepfunctions")
    while True:
        described: dict[str, Any] = sfn.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.run", description=__doc__.splitlines()[0])
    parser.add_argument("stack", help="the Pulumi stack (small, medium, large)")
    parser.add_argument("--date", help="the night to run (YYYY-MM-DD); default: today (UTC)")
    parser.add_argument("--outputs", help="saved `pulumi stack output --json` instead of calling pulumi")
    parser.add_argument("--wait", action="store_true", help="wait for the run to end; exit 1 if it failed")
    parser.add_argument("--poll", type=float, default=30.0, help="seconds between checks with --wait")
    args = parser.parse_args(argv)
    try:
        outputs = load_outputs(args.stack, args.outputs)
        night = run_date(args.date)
        execution_arn = start_run(outputs, night)
    except (OutputsError, RunError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"started the nightly run of {args.stack} for {night}: {execution_arn}")
    print(f"follow it with: python -m infra.status {args.stack}")
    if not args.wait:
        return 0
    ended = wait(outputs, execution_arn, args.poll)
    print(f"{ended['status']}: {ended.get('cause') or ended.get('output') or ''}")
    return 0 if ended["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
