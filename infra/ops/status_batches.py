"""The Batch API's batches for `python -m infra.status STACK --batches`: id, status, created, request counts, cost.

Read from the stack's bucket (the `data_bucket` output) as the API keeps them: one JSON object per batch under
`batch-api/records/batch/` (workload/batch_api/store.py's layout), in the order of the API's newest-first markers
under `batch-api/records/batch_order/` (batch_index.py): one listing and a read per batch shown (issue 61). The
operator tools read the objects, not the API's store class: infra imports only the job's contract
(tests/test_layers.py); tests/infra/test_run_status.py writes the batches through the API's own S3Store and
service, so the two cannot drift apart.

The cost is the batch's side field `llm_batch` (workload/batch_api/objects.py `gpu_share`): its job's time on the
GPU nodes and what that cost; with the stack's nightly machine (`nightly_state_machine_arn`) a closed batch also
gets its share of the boot and idle hold of the execution it ran in (monitoring/cost_report/usage.py, whose basis
docs/batch-api.md states: "Usage and cost per key"), and the table shows both and its tokens. An open batch that
would not finish in its window at the measured throughput carries `llm_batch.at_risk` (workload/batch_api/at_risk.py)
instead: the table says so in its last column, with the rows the window cannot hold, and `--json` gives the whole
report.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infra.ops.stack_outputs import OutputsError, boto_session
from monitoring.cost_report import usage as batch_usage

# The stack's outputs that say the Batch API is deployed (infra/__main__.py exports both with it).
BATCH_API_OUTPUTS = ("batch_api_url", "batch_api_tick_function_name")
RECORDS_PREFIX = "batch-api/records/batch/"  # infra/components/batch_api.py API_PREFIX + the store's records/<kind>/
# The API's listing order (workload/batch_api/batch_index.py): one empty marker per batch,
# `<inverted created_at>.<inverted sequence>.<batch id>.json`, so S3's ascending listing is newest first.
ORDER_PREFIX = "batch-api/records/batch_order/"
SIDE_FIELD = "llm_batch"
READERS = 16


@dataclass
class BatchRow:
    id: str
    status: str
    created: str
    total: int
    completed: int
    failed: int
    job_wall_s: float | None
    cost_usd: float | None
    reason: str | None
    at_risk: dict[str, Any] | None = None  # llm_batch.at_risk: rows_short, rows_per_s, ... (at_risk.py)
    key: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Its share of its execution's boot and idle hold (usage.py), None without the machine's executions.
    boot_hold_s: float | None = None
    boot_hold_cost_usd: float | None = None
    total_cost_usd: float | None = None  # cost_usd plus boot_hold_cost_usd


def batch_api_deployed(outputs: dict[str, Any]) -> bool:
    return any(outputs.get(name) for name in BATCH_API_OUTPUTS)


def list_batches(outputs: dict[str, Any], limit: int = 10, s3: Any = None, sfn: Any = None) -> list[BatchRow]:
    """The stack's batches, newest first, at most `limit`; with `sfn` (a Step Functions client), each closed
    batch's share of its execution's boot and hold."""
    if not batch_api_deployed(outputs):
        raise OutputsError("the stack has no Batch API (no batch_api_url output): set batch_api.enabled")
    bucket = outputs.get("data_bucket")
    if not bucket:
        raise OutputsError("stack outputs lack data_bucket; deploy the stack first")
    s3 = s3 or boto_session(outputs).client("s3")
    # One page of the newest-first order markers (their names end in the batch's id), then those batches: the
    # same reads at 10,000 batches as at 10. A marker whose batch is gone (past its retention, or a create that
    # died) is passed over, and the next page is asked for.
    rows: list[BatchRow] = []
    records: list[dict[str, Any]] = []
    after = None
    while len(rows) < limit:
        asked: dict[str, Any] = {"Bucket": bucket, "Prefix": ORDER_PREFIX, "MaxKeys": min(limit - len(rows), 1000)}
        if after is not None:
            asked["StartAfter"] = after
        keys = [str(item["Key"]) for item in s3.list_objects_v2(**asked).get("Contents", [])]
        markers = [key for key in keys if key.endswith(".json")]

        def read(marker: str) -> dict[str, Any] | None:
            batch_id = marker.removeprefix(ORDER_PREFIX).removesuffix(".json").split(".", 2)[2]
            try:
                record: dict[str, Any] = json.loads(
                    s3.get_object(Bucket=bucket, Key=f"{RECORDS_PREFIX}{batch_id}.json")["Body"].read()
                )
            except s3.exceptions.NoSuchKey:  # deleted (past its retention) between the listing and the read
                return None
            return record

        with ThreadPoolExecutor(max_workers=READERS) as pool:
            found = [record for record in pool.map(read, markers) if record is not None]
        records += found
        rows += [_row(record) for record in found]
        if len(keys) < asked["MaxKeys"]:
            break
        after = keys[-1]
    rows = rows[:limit]
    if sfn is not None:
        _add_shares(rows, records[:limit], batch_usage.BucketReader(s3, bucket, sfn))
    return rows


def _add_shares(rows: list[BatchRow], records: list[dict[str, Any]], reader: batch_usage.BucketReader) -> None:
    """Each closed batch's share of its execution's boot and hold (one DescribeExecution an execution)."""
    closed = [(row, record) for row, record in zip(rows, records, strict=True) if record.get("_done_at")]
    usages = {}
    for row, record in closed:
        reader.records[row.id] = record
        arn = reader.execution_of(record)
        usages[row.id] = batch_usage.batch_usage(record, arn.rsplit(":", 1)[-1] if arn else None)
    for arn in sorted({a for _, record in closed if (a := reader.execution_of(record)) is not None}):
        batch_usage.share_execution(reader, arn, list(usages.values()))
    for row, _ in closed:
        share = usages[row.id]
        row.boot_hold_s, row.boot_hold_cost_usd = share.boot_hold_gpu_s, round(share.boot_hold_cost_usd, 6)
        row.total_cost_usd = round(share.cost_usd, 6)


def _row(record: dict[str, Any]) -> BatchRow:
    counts = record.get("request_counts") or {}
    share = record.get(SIDE_FIELD) or {}
    errors = (record.get("errors") or {}).get("data") or []
    reason = None
    if errors:
        first = errors[0]
        reason = f"{first.get('code')}: {first.get('message')}" if first.get("message") else str(first.get("code"))
    return BatchRow(
        id=record["id"],
        status=record["status"],
        created=datetime.fromtimestamp(int(record["created_at"]), UTC).isoformat(timespec="seconds"),
        total=int(counts.get("total") or 0),
        completed=int(counts.get("completed") or 0),
        failed=int(counts.get("failed") or 0),
        job_wall_s=share.get("job_wall_s"),
        cost_usd=share.get("cost_usd"),
        reason=reason,
        at_risk=share.get("at_risk"),
        key=record.get("_owner"),
        input_tokens=(record.get("usage") or {}).get("input_tokens"),
        output_tokens=(record.get("usage") or {}).get("output_tokens"),
    )


def render_batches(rows: list[BatchRow]) -> str:
    header = (
        f"{'created (UTC)':25} {'batch':30} {'key':16} {'status':11} {'done/failed/total':>17} {'tokens in/out':>15} "
        f"{'GPU time':>9} {'cost':>9} {'boot+hold':>9} {'total':>9}"
    )
    lines = [header + "  reason (or at risk)"]
    for row in rows:
        counted = f"{row.completed}/{row.failed}/{row.total}"
        tokens = f"{row.input_tokens}/{row.output_tokens}" if row.input_tokens is not None else "-"
        gpu = f"{row.job_wall_s / 60:.1f} min" if row.job_wall_s is not None else "-"
        cost = f"${row.cost_usd:.4f}" if row.cost_usd is not None else "-"
        boot = f"${row.boot_hold_cost_usd:.4f}" if row.boot_hold_cost_usd is not None else "-"
        total = f"${row.total_cost_usd:.4f}" if row.total_cost_usd is not None else "-"
        note = row.reason or _at_risk_note(row.at_risk)
        line = (
            f"{row.created:25} {row.id:30} {row.key or '-':16} {row.status:11} {counted:>17} {tokens:>15} {gpu:>9} "
            f"{cost:>9} {boot:>9} {total:>9}  {note}"
        )
        lines.append(line.rstrip())
    if not rows:
        lines.append("(no batches yet)")
    return "\n".join(lines)


def _at_risk_note(report: dict[str, Any] | None) -> str:
    if not report:
        return ""
    needed = report.get("rows_per_s_needed")
    pace = f"needs {needed} rows/s" if needed is not None else "its window is over"
    return (
        f"AT RISK: {report.get('rows_short')} rows short of its window ({report.get('rows_ahead')} ahead, "
        f"{report.get('rows_left')} its own; measured {report.get('rows_per_s')} rows/s, {pace})"
    )
