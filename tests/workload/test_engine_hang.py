"""A night of rows that used to hang or end it, through the real job (Ray, Ray Data LLM, vLLM, the tiny model).

- A seed set in one row only: before the fix it reached vLLM's engine core as a float, the core's input thread
  died on its type check, and the run waited forever. Now every integer field set in some rows only arrives as an
  int, and the row is answered.
- A stuck engine: the failpoint sends one row's request to the real engine core with a float seed, which kills
  the core's input thread exactly as that bug did (workload/failpoints.py). The guard sees no progress for
  `engine.hang_timeout_s`, rebuilds the engine, isolates the row as `engine_hang` and answers the rest.
- JSON nested past the parser's limit, an integer past Python's digit limit, and a line over
  `input.max_record_bytes`: error rows, not a failed id pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.workload.jobrun import ENGINE, run_job, write_config

pytestmark = pytest.mark.slow


def test_seeded_rows_a_stuck_engine_and_unreadable_lines_end_as_one_row_each(tmp_path: Path) -> None:
    lines = [
        {"id": f"s{i}", "prompt": f"Row {i}: say something.", "sampling_params": {"max_tokens": 16}} for i in range(6)
    ]
    lines[1]["sampling_params"]["min_tokens"] = 2
    lines[2]["sampling_params"]["top_k"] = 5
    lines[3]["sampling_params"]["seed"] = 3  # the reproduction: the one seeded row of six
    lines.insert(4, {"id": "stuck", "prompt": "The engine core stalls on this one."})
    raw = [json.dumps(line).encode() for line in lines]
    raw += [
        b'{"id": "deep", "prompt": "x", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"id": "huge-int", "prompt": "x", "n": ' + b"7" * 5000 + b"}",
        b'{"id": "too-large", "prompt": "' + b"a" * 400_000 + b'"}',
    ]
    source = tmp_path / "in" / "night.jsonl"
    source.parent.mkdir()
    source.write_bytes(b"\n".join(raw) + b"\n")
    out = tmp_path / "out"
    config = write_config(
        tmp_path / "job.yaml",
        str(source.parent),
        str(out),
        tmp_path / "models",
        input={"uri": str(source.parent), "max_record_bytes": 262144},
        # Batches of two and no whole-batch retry: the stuck row is found in few stalls; a row that only shared
        # the engine with it still runs alone before it could be blamed.
        engine={**ENGINE, "hang_timeout_s": 8, "crash_retries": 0},
        batch_size=2,
        sampling={"max_tokens": 8, "temperature": 0.8},
    )
    code, log = run_job(
        ["run", "--config", str(config)], env={"LLM_BATCH_FAILPOINT": "engine_hang_on_row:stuck"}, timeout=480
    )
    assert code == 0, log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows_in"] == 10 and summary["rows_ok"] == 6 and summary["rows_failed"] == 4, summary
    assert summary["errors_by_type"] == {"engine_hang": 1, "malformed_json": 2, "record_too_large": 1}, summary
    assert summary["engine_restarts"] >= 1, summary
    errors = [
        json.loads(line)
        for f in sorted((out / "errors").rglob("*.jsonl"))
        for line in f.read_text().split("\n")
        if line
    ]
    by_type = {e["error_type"]: e for e in errors}
    assert by_type["engine_hang"]["id"] == "stuck"
    assert "no engine progress for" in by_type["engine_hang"]["error_message"]
    assert "engine.hang_timeout_s=8" in by_type["engine_hang"]["error_message"]
    answered = {row["id"] for f in (out / "results").rglob("*.parquet") for row in pq.read_table(f).to_pylist()}
    assert answered == {f"s{i}" for i in range(6)}
    assert "the engine died and was rebuilt" in log  # the driver says so, in one line
