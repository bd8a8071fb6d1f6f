"""`python -m workload show OUTPUT`: what a run left, read back from its output (a local folder or s3://).

The summary (or, for a run that has not finished, how many shards are committed and why it stopped), error counts
by type counted from errors/ itself, and the first few answers from results/. Reads only committed files.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from workload.files.storage import Location, StorageError, list_files, read_bytes
from workload.job.output import OutputStore

TEXT_WIDTH = 100


def _error_counts(errors: list[Location]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for part in errors:
        for line in read_bytes(part).decode("utf-8").splitlines():
            if line.strip():
                counts[str(json.loads(line).get("error_type", "unknown"))] += 1
    return counts


def _first_results(results: list[Location], limit: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for part in results:
        if len(rows) >= limit:
            break
        names = pq.read_schema(part.path, filesystem=part.fs).names
        # An embedding output (task embed) holds vectors where a generation output holds text.
        wanted = [c for c in ("embedding", "embeddings") if c in names] or ["finish_reason", "generated_text"]
        table = pq.read_table(part.path, filesystem=part.fs, columns=["id", *wanted])
        rows.extend(table.slice(0, limit - len(rows)).to_pylist())
    return rows


def _result_line(row: dict[str, Any]) -> str:
    if "generated_text" in row:
        return f"  {row['id']}  [{row['finish_reason']}]  {_clip(row['generated_text'])}"
    vectors = [row["embedding"]] if "embedding" in row else row["embeddings"]
    head = ", ".join(f"{x:.4f}" for x in vectors[0][:4])
    return f"  {row['id']}  [{len(vectors)} x {len(vectors[0])} floats]  {head}, ..."


def _clip(text: str) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= TEXT_WIDTH else flat[: TEXT_WIDTH - 3] + "..."


def render(uri: str, limit: int = 5) -> str:
    """The report for the output at `uri`; StorageError when there is no run output there."""
    store = OutputStore(uri)
    files = list_files(store.root)
    results = [f for f in files if "/results/" in f.uri and f.uri.endswith(".parquet")]
    errors = [f for f in files if "/errors/" in f.uri and f.uri.endswith(".jsonl")]
    commits = [f for f in files if "/_commits/" in f.uri]
    summary, failure, interrupted = store.read_summary(), store.read_failure(), store.read_interrupted()
    if not (results or errors or commits or summary or failure):
        raise StorageError(
            f"no run output at {uri}: expected summary.json, results/ or errors/ there; check the path and date"
        )
    lines = [f"output: {store.root.uri}"]
    if summary is not None:
        lines.append(
            f"summary: {summary['rows_ok']}/{summary['rows_in']} rows answered, {summary['rows_failed']} errors; "
            f"{summary['input_tokens']} tokens in, {summary['output_tokens']} out; "
            f"{summary['output_tok_per_s']} output tok/s over {summary['wall_s']} s ({summary['attempts']} attempt(s))"
        )
        lines.append(
            f"  model: {summary.get('model')} on {summary.get('device')}; finished {summary.get('finished_at')}"
        )
        if summary.get("cost_usd") is not None:
            lines.append(f"  cost: {summary['cost_usd']} USD")
    else:
        lines.append(f"summary: none yet (the run has not finished); {len(commits)} shard(s) committed")
    if failure is not None:
        lines.append(
            f"failed: {failure.get('error_type')}: {failure.get('error_message')} ({failure.get('failed_at')})"
        )
    if interrupted is not None:
        lines.append("interrupted: the last attempt was stopped; running the same night again resumes it")
    counts = _error_counts(errors)
    by_type = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    lines.append(f"errors by type: {by_type or 'none'}")
    first = _first_results(results, limit)
    lines.append(f"first {len(first)} result(s):" if first else "results: none committed yet")
    lines.extend(_result_line(row) for row in first)
    return "\n".join(lines)
