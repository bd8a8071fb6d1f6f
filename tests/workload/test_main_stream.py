"""The main stream's one parse per line (issue 50): a block of records is validated once, its valid rows become the
engine's input and its rejected rows (every kind of validation failure, and a repeated id's later row) go to the
driver's collector as error rows. The blocks come from RecordReader's real reads of a local file, run in this
process as in test_input_plan.py; the collector is the actor's own class, called in process. The whole stream, Ray
and the engine included, runs in the job's end-to-end tests (test_streaming_input.py, test_job_e2e.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from workload.contract.config import InputConfig, SamplingParams
from workload.job.input_plan import REJECTED_PREFIX, plan_input
from workload.job.input_stream import ERROR_COLUMN, RecordReader, _validated
from workload.job.rejects import RejectsCollector


def _blocks(folder: Path, shard_rows: int, shards: set[int] | None, max_record_bytes: int) -> list[pa.Table]:
    """The main stream's blocks of every file of `folder`, read as its read tasks read them."""
    listed = plan_input(InputConfig(uri=str(folder), max_record_bytes=max_record_bytes))
    first, files = 0, []
    for file in listed.files:  # counted as the id pass would: one record per line here
        records = sum(1 for line in Path(file.path).read_bytes().splitlines() if line.strip())
        files.append(replace(file, first=first, records=records))
        first += records
    reader = RecordReader(files, shard_rows, shards, max_record_bytes)
    blocks = []
    for file in files:
        with reader._open_input_source(None, file.path) as stream:
            blocks.extend(reader._read_stream(stream, file.path))
    return blocks


def test_one_validation_of_a_block_feeds_the_engine_and_the_rejected_rows(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "a", "prompt": "first"}),
        '{"id": "broken", "prompt": ',
        json.dumps(["not", "an", "object"]),
        json.dumps({"id": "b", "prompt": "x" * 2000}),  # over the record cap below
        json.dumps({"id": "a", "prompt": "again"}),  # a repeated id: its first row (position 0) wins
        json.dumps({"id": "c", "prompt": "kept", "sampling_params": {"temperature": -1}}),
        json.dumps({"id": "d", "prompt": "last"}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    [block] = _blocks(tmp_path, shard_rows=100, shards=None, max_record_bytes=1024)
    collector = RejectsCollector()
    valid = _validated(block, SamplingParams(), {"a": 0}, collector.put)

    assert valid.column("id").to_pylist() == ["a", "d"] and valid.column("_pos").to_pylist() == [0, 6]
    assert set(valid.column(ERROR_COLUMN).to_pylist()) == {""}  # the engine's rows carry no error
    [rejected] = collector.drain()
    assert collector.drain() == []  # drained once: the driver never takes a row twice from the collector
    got = rejected.select(["_pos", "_line", "_error_type"]).to_pylist()
    assert [(r["_pos"], r["_line"]) for r in got] == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    kinds = [r["_error_type"] for r in got]
    assert kinds[:4] == ["malformed_json", "not_an_object", "record_too_large", "duplicate_id"]
    assert kinds[4] not in ("", None)  # the out-of-range temperature: refused by its own validation type
    messages = rejected.column(ERROR_COLUMN).to_pylist()
    assert all(m.startswith(REJECTED_PREFIX) for m in messages)
    assert "appeared earlier" in messages[3]
    assert rejected.column("_raw").to_pylist()[0] == lines[1]  # the bad line's own bytes, for errors.jsonl
    # Every record of the block came out exactly once, on one side or the other.
    assert sorted(valid.column("_pos").to_pylist() + [r["_pos"] for r in got]) == list(range(len(lines)))


def test_a_clean_block_hands_nothing_to_the_collector_and_only_pending_shards_are_read(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "prompt": "p"}) + "\n" for i in range(6)))
    blocks = _blocks(tmp_path, shard_rows=2, shards={1}, max_record_bytes=1 << 20)
    collector = RejectsCollector()
    valid = [_validated(block, SamplingParams(), {}, collector.put) for block in blocks]
    assert [row for table in valid for row in table.column("_pos").to_pylist()] == [2, 3]
    assert collector.drain() == []
