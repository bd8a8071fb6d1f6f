"""A row that reaches the driver twice (a batch Ray reran after a lost node, whose first answers had already come
back) is written once, and counted. The committer and a local output store are the real ones; the rows stand in
for the pipeline's output, whose columns workload/engine/pipeline.py defines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from workload.contract.config import build_config
from workload.job.committer import ShardCommitter
from workload.job.output import OutputStore
from workload.telemetry.metrics import NullMetrics


def _answer(position: int, text: str) -> dict[str, Any]:
    return {
        "_pos": position,
        "id": f"r{position}",
        "generated_text": text,
        "num_input_tokens": 3,
        "num_generated_tokens": 2,
        "_max_tokens": 16,
        "__inference_error__": "",
        "batch_uuid": "b",
        "time_taken_llm": 0.1,
        "_passthrough": None,
    }


def test_a_row_answered_twice_is_written_once_and_counted(tmp_path: Path) -> None:
    config = build_config(
        {"input": {"uri": "in.jsonl"}, "output": {"uri": str(tmp_path / "out")}}, {"output.shard_rows": 2}
    )
    store = OutputStore(str(tmp_path / "out"))
    committer = ShardCommitter(store, config, 4, {0, 1}, {}, 1, NullMetrics(), lambda: None)

    # Shard 0 gets row 0 twice before it completes (the repeat is dropped), then row 1: it commits.
    committer.take(pa.Table.from_pylist([_answer(0, "first"), _answer(0, "again"), _answer(1, "one")]))
    assert [c.shard for c in committer.commits] == [0]
    # A rerun batch brings back rows of the committed shard 0 with shard 1's: only shard 1's are new.
    committer.take(pa.Table.from_pylist([_answer(1, "rerun"), _answer(2, "two"), _answer(3, "three")]))
    assert sorted(c.shard for c in committer.commits) == [0, 1]
    assert committer.rows_redelivered == 2
    assert not committer.pending and not committer.seen  # nothing kept for committed shards

    written = [
        (row["id"], row["generated_text"])
        for path in sorted((tmp_path / "out" / "results").rglob("*.parquet"))
        for row in pq.read_table(path).to_pylist()
    ]
    assert sorted(written) == [("r0", "first"), ("r1", "one"), ("r2", "two"), ("r3", "three")]
