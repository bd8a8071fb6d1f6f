"""The last nightly runs: `python -m infra.status STACK [--limit N] [--outputs FILE] [--json] [--batches]`.

For each execution of the stack's nightly state machine: state, start, duration, rows (from the run's
summary.json in S3) and cost. Cost is the job's own figure when its summary has one (`cost_usd`), else
GPU-hours held (the execution's duration) times `--price-per-hour` when given.

`--batches` lists the Batch API's batches instead (batch_api.enabled), newest first: status, created, request
counts, the job's GPU time and cost (infra/ops/status_batches.py). A batch's execution is also one of the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from infra.ops.run import STATE_MACHINE_OUTPUT
from infra.ops.stack_outputs import OutputsError, boto_session, load_outputs, require
from infra.ops.status_batches import batch_api_deployed, list_batches, render_batches


@dataclass
class RunRow:
    name: str
    state: str
    started: str
    duration_s: float
    date: str | None
    rows_in: int | None
    rows_ok: int | None
    rows_failed: int | None
    cost_usd: float | None
    cost_basis: str
    reason: str | None


def last_runs(outputs: dict[str, Any], limit: int = 10, price_per_hour: float | None = None) -> list[RunRow]:
    (arn,) = require(outputs, STATE_MACHINE_OUTPUT)
    session = boto_session(outputs)
    sfn, s3 = session.client("stepfunctions"), session.client("s3")
    executions = sfn.list_executions(stateMachineArn=arn, maxResults=limit)["executions"]
    now = datetime.now(UTC)
    rows = []
    for execution in executions:
        described = sfn.describe_execution(executionArn=execution["executionArn"])
        started = described["startDate"]
        stopped = described.get("stopDate") or now
        duration_s = max(0.0, (stopped - started).total_seconds())
        result = json.loads(described.get("output") or "{}")
        run_input = json.loads(described.get("input") or "{}")
        summary = _read_summary(s3, result.get("summary_uri")) if described["status"] == "SUCCEEDED" else None
        cost, basis = _cost(summary, duration_s, price_per_hour)
        rows.append(
            RunRow(
                name=described["name"],
                # A night with no input ends SUCCEEDED with {"status": "skipped"}: shown as what it was.
                state="SKIPPED" if result.get("status") == "skipped" else described["status"],
                started=started.astimezone(UTC).isoformat(timespec="seconds"),
                duration_s=round(duration_s, 1),
                # A batch's execution carries its start's date beside the batch (sfn_executor.run_input).
                date=result.get("date") or run_input.get("date") or (run_input.get("batch") or {}).get("date"),
                rows_in=summary.get("rows_in") if summary else None,
                rows_ok=summary.get("rows_ok") if summary else None,
                rows_failed=summary.get("rows_failed") if summary else None,
                cost_usd=cost,
                cost_basis=basis,
                reason=result.get("reason") if result.get("status") == "skipped" else _reason(described),
            )
        )
    return rows


def _read_summary(s3: Any, uri: str | None) -> dict[str, Any] | None:
    if not uri:
        return None
    parsed = urlparse(uri)
    try:
        body = s3.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"].read()
    except ClientError:
        return None  # e.g. the output was archived or deleted since
    summary: dict[str, Any] = json.loads(body)
    return summary


def _cost(summary: dict[str, Any] | None, duration_s: float, price: float | None) -> tuple[float | None, str]:
    if summary and isinstance(summary.get("cost_usd"), int | float):
        return round(float(summary["cost_usd"]), 2), "job"
    if price is not None:
        return round(duration_s / 3600 * price, 2), "gpu-hours x price"
    return None, "unknown (pass --price-per-hour)"


def _reason(described: dict[str, Any]) -> str | None:
    cause = described.get("cause")
    if not cause:
        return described.get("error")
    try:
        failure = json.loads(cause)
    except json.JSONDecodeError:
        return str(cause)
    return f"{failure.get('Error')}: {failure.get('Cause')}" if isinstance(failure, dict) else str(cause)


def render(rows: list[RunRow]) -> str:
    header = f"{'started (UTC)':25} {'date':10} {'state':9} {'duration':>9} {'rows ok/in':>15} {'cost':>9}  reason"
    lines = [header]
    for row in rows:
        minutes = f"{row.duration_s / 60:.1f} min"
        counted = f"{row.rows_ok}/{row.rows_in}" if row.rows_in is not None else "-"
        cost = f"${row.cost_usd:.2f}" if row.cost_usd is not None else "-"
        lines.append(
            f"{row.started:25} {row.date or '-':10} {row.state:9} {minutes:>9} {counted:>15} {cost:>9}  "
            f"{row.reason or ''}".rstrip()
        )
    if not rows:
        lines.append("(no runs yet)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from workload.contract.cli_errors import HELP_EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m infra.status",
        description=__doc__.splitlines()[0],
        epilog=(
            "examples: python -m infra.status small; python -m infra.status large --limit 3 --json; "
            f"python -m infra.status small --batches. {HELP_EPILOG}"
        ),
    )
    parser.add_argument("stack", help="the Pulumi stack (small, medium, large)")
    parser.add_argument("--limit", type=int, default=10, help="how many runs, newest first")
    parser.add_argument("--outputs", help="saved `pulumi stack output --json` instead of calling pulumi")
    parser.add_argument("--price-per-hour", type=float, help="USD per hour of the run's GPU capacity")
    parser.add_argument("--json", action="store_true", help="the runs (or batches) as JSON, one object each")
    parser.add_argument("--batches", action="store_true", help="the Batch API's batches instead of the runs")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error("--limit must be at least 1")
    try:
        outputs = load_outputs(args.stack, args.outputs)
        if args.batches:
            # With the nightly machine, each closed batch's share of its execution's boot and hold (usage.py).
            sfn = boto_session(outputs).client("stepfunctions") if outputs.get(STATE_MACHINE_OUTPUT) else None
            batches = list_batches(outputs, args.limit, sfn=sfn)
            print(json.dumps([asdict(row) for row in batches], indent=2) if args.json else render_batches(batches))
            if not args.json:
                print(f"usage and cost per key a day: python -m infra.usage {args.stack} --day YYYY-MM-DD")
            return 0
        rows = last_runs(outputs, args.limit, args.price_per_hour)
    except OutputsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    else:
        print(render(rows))
        if batch_api_deployed(outputs):
            print(f"the Batch API's batches: python -m infra.status {args.stack} --batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
