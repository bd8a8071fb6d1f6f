"""`python -m workload show` on a local output the commit protocol wrote (S3: tests/test_readme_walk.py), and
`validate`, which needs no output.

The output is written by the job's own OutputStore, not by hand, so `show` reads exactly what a run leaves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from workload.cli import commands as cli
from workload.job.output import OutputStore

STATS = {"rows_ok": 7, "rows_failed": 2, "input_tokens": 70, "output_tokens": 90, "error_types": {}}


def test_a_failed_run_shows_its_committed_shards_the_failure_and_errors_by_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = OutputStore(str(tmp_path / "out"))
    ids = [f"r{i}" for i in range(7)]
    long_text = "word " * 60
    table = pa.table({"id": ids, "generated_text": [long_text] * 7, "finish_reason": ["length"] * 7})
    errors = [
        {"id": "e1", "error_type": "malformed_json", "error_message": "bad"},
        {"id": "e2", "error_type": "prompt_too_long", "error_message": "long"},
    ]
    store.commit_shard(0, table, errors, STATS, attempt=1)
    store.commit_shard(1, None, [{"id": "e3", "error_type": "malformed_json", "error_message": "bad"}], STATS, 1)
    store.write_failure("EngineDeadError", "the engine died")

    assert cli.main(["show", str(tmp_path / "out"), "--limit", "3"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[1] == "summary: none yet (the run has not finished); 2 shard(s) committed"
    assert shown[2].startswith("failed: EngineDeadError: the engine died (")
    assert "errors by type: malformed_json 2, prompt_too_long 1" in shown
    assert "first 3 result(s):" in shown
    first = next(line for line in shown if line.startswith("  r0  [length]  "))
    assert first.endswith("...") and len(first) < 130  # long answers are clipped to one line


def test_validate_needs_no_output(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    assert cli.main(["validate", "--input", str(root / "data" / "sample.jsonl")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rows_in"], report["rows_valid"], report["rows_invalid"]) == (195, 190, 5)
