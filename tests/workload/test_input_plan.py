"""The input plan: every file's record count fixes each row's position and shard before any row is read, from one
listing (no request per file on S3) and a streamed count; a resume over unchanged files counts nothing again."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.contract.config import InputConfig
from workload.files.rows import InputError
from workload.job.input_plan import plan_input


def test_positions_follow_path_order_and_counts_skip_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"id": 1}\n\n   \n{"id": 2}\r\n{"id": 3}')
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n')
    (tmp_path / "_SUCCESS").write_bytes(b"")
    pq.write_table(pa.table({"id": ["p0", "p1"]}), tmp_path / "c.parquet")
    plan = plan_input(InputConfig(uri=str(tmp_path)))
    assert [(Path(f.uri).name, f.first, f.records) for f in plan.files] == [
        ("a.jsonl", 0, 1),
        ("b.jsonl", 1, 3),
        ("c.parquet", 4, 2),
    ]
    assert plan.rows_in == 6
    # Shards of 2 rows: shard 0 is rows 0-1 (a, b), shard 2 is rows 4-5 (c only).
    assert [Path(f.uri).name for f in plan.files_with({2}, 2)] == ["c.parquet"]
    assert [Path(f.uri).name for f in plan.files_with({0}, 2)] == ["a.jsonl", "b.jsonl"]


def test_a_resume_reuses_the_recorded_counts_of_unchanged_files_only(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n{"id": 1}\n')
    first = plan_input(InputConfig(uri=str(tmp_path)))
    listing = first.listing()
    # A recorded count is trusted only while the file's size and version are the ones recorded with it.
    listing[first.files[0].uri]["records"] = 7
    assert plan_input(InputConfig(uri=str(tmp_path)), listing).rows_in == 7
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 0}\n{"id": 1}\n{"id": 2}\n')
    assert plan_input(InputConfig(uri=str(tmp_path)), listing).rows_in == 3


def test_s3_prefix_lists_versions_without_a_request_per_file(moto_endpoint: str) -> None:
    bucket = f"plan-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for index in range(3):
        s3.put_object(Bucket=bucket, Key=f"in/part-{index}.jsonl", Body=b'{"id": 1}\n' * (index + 1))
    s3.put_object(Bucket=bucket, Key="input2/other.jsonl", Body=b'{"id": 9}\n')
    plan = plan_input(InputConfig(uri=f"s3://{bucket}/in"))
    assert [f.records for f in plan.files] == [1, 2, 3]
    assert all(f.version.startswith("etag:") for f in plan.files)
    head = s3.head_object(Bucket=bucket, Key="in/part-0.jsonl")
    assert plan.files[0].version == f"etag:{head['ETag'].strip(chr(34))}"


def test_no_input_files_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="holds no input files"):
        plan_input(InputConfig(uri=str(tmp_path / "nothing")))
