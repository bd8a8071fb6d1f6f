"""The input streams from the cluster's readers: 50 files with ids repeated across them, and one file far larger
than the driver's memory grows by, in one job run (one engine start). Real Ray, real vLLM on the tiny model.

The big file's rows are valid JSON padded with insignificant whitespace: hundreds of MB to read, split and parse,
with only a few hundred prompts for the engine, so the test stays short.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.workload.jobrun import run_job, write_config, write_jsonl

pytestmark = pytest.mark.slow

FILES = 50
GOOD_PER_FILE = 5
BIG_ROWS = 240
PAD_BYTES = 5 << 19  # whitespace inside each big row: 240 rows of 2.5 MiB, a 600 MiB file
BIG_BAD_LINE = 17  # a malformed line of the big file (1-based): recorded with all its bytes


def _small_files(folder: Path) -> None:
    for file in range(FILES):
        rows: list[Any] = [
            {"id": f"r-{file:02d}-{j}", "prompt": f"file {file} row {j}", "src": file} for j in range(GOOD_PER_FILE)
        ]
        if file:  # repeats the first id of the file before: the earlier file's row is the one kept
            rows.insert(2, {"id": f"r-{file - 1:02d}-0", "prompt": "again", "src": file})
        if file % 10 == 3:
            rows.insert(1, '{"id": "broken", ')
        write_jsonl(folder / f"f-{file:02d}.jsonl", rows)


def _big_file(path: Path) -> int:
    pad = b" " * PAD_BYTES
    with open(path, "wb") as handle:
        for row in range(BIG_ROWS):
            if row + 1 == BIG_BAD_LINE:
                handle.write(b'{"id": "big-bad", "prompt": ' + pad + b"\n")
                continue
            handle.write(b'{"id": "big-%d",' % row + pad + b'"prompt": "big row %d", "src": 99}\n' % row)
    return path.stat().st_size


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("stream")
    inputs = root / "in"
    inputs.mkdir()
    _small_files(inputs)
    big_size = _big_file(inputs / "zz-big.jsonl")
    out = root / "out"
    config = write_config(
        root / "job.yaml", str(inputs), str(out), root / "models", sampling={"max_tokens": 1, "temperature": 0.0}
    )
    code, log = run_job(["run", "--config", str(config)])
    assert code == 0, log
    errors = [json.loads(line) for f in sorted((out / "errors").glob("*.jsonl")) for line in f.read_text().splitlines()]
    return {
        "results": pq.read_table(out / "results").to_pylist(),
        "errors": errors,
        "summary": json.loads((out / "summary.json").read_text()),
        "manifest": json.loads((out / "_manifest.json").read_text()),
        "big_size": big_size,
        "log": log,
    }


def test_fifty_files_with_ids_repeated_across_files_land_once_keeping_the_first(streamed: dict[str, Any]) -> None:
    results, errors = streamed["results"], streamed["errors"]
    small = [r for r in results if r["src"] != 99]
    assert sorted(r["id"] for r in small) == sorted(f"r-{f:02d}-{j}" for f in range(FILES) for j in range(5))
    assert all(r["src"] == int(r["id"][2:4]) for r in small), "a repeated id kept a later row, not the first"
    duplicates = sorted(
        (e["id"], e["input_file"].rsplit("/", 1)[-1], e["input_line"])
        for e in errors
        if e["error_type"] == "duplicate_id"
    )
    assert duplicates == sorted(
        (f"r-{f - 1:02d}-0", f"f-{f:02d}.jsonl", 4 if f % 10 == 3 else 3) for f in range(1, FILES)
    )
    broken = sorted(
        e["input_file"].rsplit("/", 1)[-1]
        for e in errors
        if e["id"] == "broken" or e["raw_input"].startswith('{"id": "broken"')
    )
    assert broken == [f"f-{f:02d}.jsonl" for f in range(FILES) if f % 10 == 3]
    summary = streamed["summary"]
    assert summary["rows_in"] == FILES * GOOD_PER_FILE + (FILES - 1) + len(broken) + BIG_ROWS
    assert summary["rows_ok"] + summary["rows_failed"] == summary["rows_in"]
    assert len(results) + len(errors) == summary["rows_in"], "a row landed twice or not at all"


def test_a_file_far_larger_than_the_drivers_growth_streams(streamed: dict[str, Any]) -> None:
    big = [r for r in streamed["results"] if r["src"] == 99]
    assert sorted(r["id"] for r in big) == sorted(f"big-{row}" for row in range(BIG_ROWS) if row + 1 != BIG_BAD_LINE)
    bad = next(e for e in streamed["errors"] if e["input_file"].endswith("zz-big.jsonl"))
    assert (bad["input_line"], bad["error_type"]) == (BIG_BAD_LINE, "malformed_json")
    assert len(bad["raw_input"]) == len('{"id": "big-bad", "prompt": ') + PAD_BYTES  # every byte as read
    attempt = streamed["manifest"]["attempts"][0]
    memory, size_mib = attempt["driver_rss_mib"], streamed["big_size"] / (1 << 20)
    # Reading the file whole (as the driver once did) needs its bytes plus a copy split into lines: over 2x its
    # size. The streaming driver counts its records a chunk at a time (the plan), then only sees answers: its
    # peak up to the plan's end stays under half the file, and it grows by less than a tenth of it while the
    # rows stream (its baseline then is Ray, pyarrow and Ray Data LLM's imports).
    assert memory["peak_after_plan"] < size_mib / 2, f"{memory} for a {size_mib:.0f} MiB file"
    growth = attempt["driver_peak_rss_mib"] - memory["before_stream"]
    assert growth < size_mib / 10, f"{memory}, overall peak {attempt['driver_peak_rss_mib']}: grew {growth:.0f} MiB"
