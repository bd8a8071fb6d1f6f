"""The Batch API's batches for `python -m infra.status STACK --batches`: id, status, created, request counts, cost.

Read from the stack's bucket (the `data_bucket` output) as the API keeps them: one JSON object per batch under
`batch-api/records/batch/` (workload/batch_api/store.py's layout), in the order of the API's newest-first markers
under `batch-api/records/batch_order/` (batch_index.py): one listing and a read per batch shown (issue 61). The
operator tools read the objects, not the API's store class: infra imports only the job's contract
(tests/test_layers.py); tests/infra/test_run_status.py writes the batches through the API's own S3Store and
service, so the two cannot drift apart.

The cost is the batch's side field `llm_batch` (workload/batch_api/objects.py `gpu_share`): its job's time on the
GPU nodes and what that cost. The boot of the execution it ran in is not in it: that is the execution's, in the
runs `python -m infra.status STACK` lists. An open batch that would not finish in its window at the measured
throughput carries `llm_batch.at_risk` (workload/batch_api/at_risk.py) instead: the table says so in its last
column, with the rows the window cannot hold, and `--json` gives the whole report.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infra.ops.stack_outputs import OutputsError, boto_session

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


def batch_api_deployed(outputs: dict[str, Any]) -> bool:
    return any(outputs.get(name) for name in BATCH_API_OUTPUTS)


def list_batches(outputs: dict[str, Any], limit: int = 10, s3: Any = None) -> list[BatchRow]:
    """The stack's batches, newest first, at most `limit`."""
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
            rows += [_row(record) for record in pool.map(read, markers) if record is not None]
        if len(keys) < asked["MaxKeys"]:
            break
        after = keys[-1]
    return rows[:limit]


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
    )


def render_batches(rows: list[BatchRow]) -> str:
    header = f"{'created (UTC)':25} {'batch':30} {'status':11} {'done/failed/total':>17} {'GPU time':>9} {'cost':>9}"
    lines = [header + "  reason (or at risk)"]
    for row in rows:
        counted = f"{row.completed}/{row.failed}/{row.total}"
        gpu = f"{row.job_wall_s / 60:.1f} min" if row.job_wall_s is not None else "-"
        cost = f"${row.cost_usd:.4f}" if row.cost_usd is not None else "-"
        note = row.reason or _at_risk_note(row.at_risk)
        line = f"{row.created:25} {row.id:30} {row.status:11} {counted:>17} {gpu:>9} {cost:>9}  {note}"
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
