"""The input plan and its counts: one listing (no request per file on S3) and no read of a JSONL row; each file's
record count comes out of the id pass's own read (keys of file index and row number, counted per file) and fixes
each row's position and shard; a resume over unchanged files takes the manifest's counts. The id pass's reads run
in this process here (RecordSource's open and read, as in test_pinned_input.py); the whole pass runs in the job's
end-to-end tests (test_streaming_input.py)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.bench.counted_s3 import counted_s3
from workload.contract.config import InputConfig
from workload.files import storage
from workload.files.pinned import InputChangedError
from workload.files.rows import InputError
from workload.files.storage import Location
from workload.job.input_plan import InputPlan, plan_input
from workload.job.input_stream import (
    KEY_BITS,
    RecordReader,
    _FactsCollector,
    _records_per_file,
    files_with_rejects,
    positions_of,
)


def _id_pass_counts(plan: InputPlan) -> InputPlan:
    """The id pass's reads of every file (keyed rows, counted per file by its collector), then its counted plan."""
    keyed = [replace(f, first=index << KEY_BITS) for index, f in enumerate(plan.files)]
    source = RecordReader(keyed, shard_rows=1, shards=None)
    collector = _FactsCollector()
    for file in keyed:
        with source._open_input_source(None, file.path) as stream:
            for block in source._read_stream(stream, file.path):
                records = _records_per_file(block.column("_pos"))
                collector.add(block.column("_pos")[0].as_py(), _FactsCollector().facts, records)
                collector.add(block.column("_pos")[0].as_py(), _FactsCollector().facts, records)  # a retried task
    _, records, _ = collector.result()
    return plan.with_counts([records.get(index, 0) for index in range(len(plan.files))])


def test_positions_follow_path_order_and_counts_skip_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"id": 1}\n\n   \n{"id": 2}\r\n{"id": 3}')
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n')
    (tmp_path / "_SUCCESS").write_bytes(b"")
    pq.write_table(pa.table({"id": ["p0", "p1"]}), tmp_path / "c.parquet")
    (tmp_path / "d.jsonl").write_bytes(b"")
    listed = plan_input(InputConfig(uri=str(tmp_path)))
    # Listed, not read: a JSONL file's count is the id pass's; a Parquet footer's is known at once.
    assert [f.records for f in listed.files] == [None, None, 2, None] and listed.rows_in is None
    plan = _id_pass_counts(listed)
    assert [(Path(f.uri).name, f.first, f.records) for f in plan.files] == [
        ("a.jsonl", 0, 1),
        ("b.jsonl", 1, 3),
        ("c.parquet", 4, 2),
        ("d.jsonl", 6, 0),
    ]
    assert plan.rows_in == 6
    # Shards of 2 rows: shard 0 is rows 0-1 (a, b), shard 2 is rows 4-5 (c only).
    assert [Path(f.uri).name for f in plan.files_with({2}, 2)] == ["c.parquet"]
    assert [Path(f.uri).name for f in plan.files_with({0}, 2)] == ["a.jsonl", "b.jsonl"]


def test_a_resume_reuses_the_recorded_counts_of_unchanged_files_only(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n{"id": 1}\n')
    first = _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path))))
    listing = first.listing()
    assert listing[first.files[0].uri]["records"] == 2
    # A recorded count is trusted only while the file's size and version are the ones recorded with it.
    listing[first.files[0].uri]["records"] = 7
    assert plan_input(InputConfig(uri=str(tmp_path)), listing).rows_in == 7
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n{"id": 1}\n{"id": 2}\n')
    assert plan_input(InputConfig(uri=str(tmp_path)), listing).rows_in is None  # counted again, by the id pass
    assert _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path)), listing)).rows_in == 3


def test_a_count_that_disagrees_with_the_recorded_one_is_a_changed_file(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n{"id": 1}\n')
    listing = _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path)))).listing()
    listing[str(Location(str(tmp_path / "a.jsonl")).uri)]["records"] = 7  # what the manifest said
    resumed = plan_input(InputConfig(uri=str(tmp_path)), listing)
    with pytest.raises(InputChangedError, match=r"a\.jsonl.*holds 2 records; 7 were counted before"):
        resumed.with_counts([2])


def test_repeated_ids_keyed_by_file_and_row_land_on_their_positions(tmp_path: Path) -> None:
    for name, rows in (("a.jsonl", 3), ("b.jsonl", 0), ("c.jsonl", 4)):
        (tmp_path / name).write_bytes(b'{"id": 0}\n' * rows)
    plan = _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path))))
    # Keys order rows as positions do: file a row 1 is position 1; file c row 2 is position 3 + 2 (b is empty).
    first_keys = {"x": (0 << KEY_BITS) + 1, "y": (2 << KEY_BITS) + 2}
    assert positions_of(first_keys, plan) == {"x": 1, "y": 5}


def test_the_read_of_rejected_rows_is_only_of_files_where_the_id_pass_found_one(tmp_path: Path) -> None:
    """Found in issue 50: the main stream read every file twice, once for its valid rows and once for its rejected
    ones. The second read now covers only files with a bad row or a repeated id's later row."""
    for name in "abcde":
        (tmp_path / f"{name}.jsonl").write_bytes(b'{"id": 0}\n' * 3)
    plan = _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path))))
    # A bad row in file b; an id first in c (row 0) and last in e (row 2): its later rows lie in c, d or e.
    found = files_with_rejects(plan, {1}, [((2 << KEY_BITS) + 0, (4 << KEY_BITS) + 2)])
    assert sorted(Path(uri).name for uri in found) == ["b.jsonl", "c.jsonl", "d.jsonl", "e.jsonl"]
    assert files_with_rejects(plan, set(), []) == frozenset()  # a clean input: no second read at all


def test_the_plan_reads_no_jsonl_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in issue 50: the plan's count read every input file whole, a read of its own before the id pass read
    them all again. Now the plan lists them; only the OpenAI-dialect check reads the first line of the first."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b'{"id": "a", "prompt": "p"}\n')
    (folder / "b.jsonl").write_bytes(b'{"id": "b", "prompt": "p"}\n' * 40_000)  # about 1 MiB
    with counted_s3() as s3:
        uri = s3.upload(folder, "plan")
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        storage.s3_client.cache_clear()  # the process's client, made for this server (and again after)
        try:
            plan = plan_input(InputConfig(uri=uri))
            counts = s3.take()
        finally:
            storage.s3_client.cache_clear()
    assert [f.records for f in plan.files] == [None, None]
    assert counts.get("object_get_bytes", 0) <= (folder / "a.jsonl").stat().st_size, counts


def test_s3_prefix_lists_versions_without_a_request_per_file(moto_endpoint: str) -> None:
    bucket = f"plan-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for index in range(3):
        s3.put_object(Bucket=bucket, Key=f"in/part-{index}.jsonl", Body=b'{"id": 1}\n' * (index + 1))
    s3.put_object(Bucket=bucket, Key="input2/other.jsonl", Body=b'{"id": 9}\n')
    plan = plan_input(InputConfig(uri=f"s3://{bucket}/in"))
    assert [f.records for f in plan.files] == [None, None, None]  # the id pass counts them
    assert all(f.version.startswith("etag:") for f in plan.files)
    head = s3.head_object(Bucket=bucket, Key="in/part-0.jsonl")
    assert plan.files[0].version == f"etag:{head['ETag'].strip(chr(34))}"


def test_no_input_files_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="holds no input files"):
        plan_input(InputConfig(uri=str(tmp_path / "nothing")))
