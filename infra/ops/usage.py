"""A day's Batch API usage and cost, per key and per batch: `python -m infra.usage STACK [--day D] [--format F]`.

Tokens in and out (cached and reasoning among them), GPU-seconds and cost of every batch that closed on the UTC day
`--day` (yesterday by default), and the same summed per key: as text, CSV (`--format csv`, one row per key, or per
batch with `--per-batch`) or JSON (`--format json`: keys, batches, the executions whose boot and hold they share,
and the basis). A batch's cost includes its share of its execution's boot and idle hold; the basis is stated in
the output and in docs/batch-api.md ("Usage and cost per key"). The figures come from
monitoring/cost_report/usage.py, the same code the daily cost report runs, reading the stack's bucket (the
`data_bucket` output) and its nightly machine's executions (`nightly_state_machine_arn`).

Why a command and not a route of the API: the API's keys are tenants, and no key may see another's usage; the
operator who reads every key's is the one with the stack's AWS credentials, as for `python -m infra.status`.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, date, datetime, timedelta
from typing import Any

from infra.ops.run import STATE_MACHINE_OUTPUT
from infra.ops.stack_outputs import OutputsError, boto_session, load_outputs
from infra.ops.status_batches import batch_api_deployed
from monitoring.cost_report import usage as batch_usage


def day_usage(outputs: dict[str, Any], day: date, s3: Any = None, sfn: Any = None) -> batch_usage.DayUsage:
    if not batch_api_deployed(outputs):
        raise OutputsError("the stack has no Batch API (no batch_api_url output): set batch_api.enabled")
    bucket = outputs.get("data_bucket")
    if not bucket:
        raise OutputsError("stack outputs lack data_bucket; deploy the stack first")
    if s3 is None or (sfn is None and outputs.get(STATE_MACHINE_OUTPUT)):
        session = boto_session(outputs)
        s3 = s3 or session.client("s3")
        sfn = sfn or (session.client("stepfunctions") if outputs.get(STATE_MACHINE_OUTPUT) else None)
    return batch_usage.read_day(batch_usage.BucketReader(s3, bucket, sfn), day)


def render(usage: batch_usage.DayUsage) -> str:
    lines = [
        f"Batch API usage on {usage.day} (UTC): {len(usage.batches)} batch(es), {usage.cost_usd:.4f} USD",
        f"{'key':24} {'batches':>7} {'in tok':>10} {'cached':>9} {'out tok':>10} {'reasoning':>9} "
        f"{'GPU s':>9} {'boot+hold s':>11} {'cost USD':>10}",
    ]
    for row in usage.by_key():
        lines.append(
            f"{row.key:24} {row.batches:>7} {row.input_tokens:>10} {row.cached_tokens:>9} {row.output_tokens:>10} "
            f"{row.reasoning_tokens:>9} {row.gpu_s:>9.1f} {row.boot_hold_gpu_s:>11.1f} {row.cost_usd:>10.4f}"
        )
    if not usage.batches:
        lines.append("(no batch closed that day)")
    for execution in usage.executions:
        note = " (still running: shared as of now)" if execution.provisional else ""
        unmatched = f", {execution.runs_unmatched} run(s) of no batch found" if execution.runs_unmatched else ""
        lines.append(
            f"execution {execution.name}: held {execution.held_s:.0f} s, jobs {execution.job_s:.0f} s, boot and hold "
            f"{execution.boot_hold_s:.0f} s shared by {len(execution.batches)} batch(es){unmatched}{note}"
        )
    lines.append(f"basis: {usage.basis}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from workload.contract.cli_errors import HELP_EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m infra.usage",
        description=__doc__.splitlines()[0],
        epilog=f"examples: python -m infra.usage small --day 2026-12-06 --format csv. {HELP_EPILOG}",
    )
    parser.add_argument("stack", help="the Pulumi stack (small, medium, large)")
    parser.add_argument("--day", type=date.fromisoformat, help="the UTC day, YYYY-MM-DD (default: yesterday)")
    parser.add_argument("--format", choices=("text", "csv", "json"), default="text")
    parser.add_argument("--per-batch", action="store_true", help="CSV: one row per batch instead of per key")
    parser.add_argument("--outputs", help="saved `pulumi stack output --json` instead of calling pulumi")
    args = parser.parse_args(argv)
    day = args.day or (datetime.now(UTC) - timedelta(days=1)).date()
    try:
        usage = day_usage(load_outputs(args.stack, args.outputs), day)
    except OutputsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(usage.as_json(), indent=2))
    elif args.format == "csv":
        sys.stdout.write(usage.as_csv("batch" if args.per_batch else "key"))
    else:
        print(render(usage))
    return 0
