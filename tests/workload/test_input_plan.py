"""The input plan and its counts: one listing (no request per file on S3) and no read of a JSONL row; each file's
record count comes out of the id pass's own read (keys of file index and row number, counted per file) and fixes
each row's position and shard; a resume over unchanged files takes the manifest's counts. The id pass's reads run
in this process here (RecordSource's open and read, as in test_pinned_input.py); the whole pass runs in the job's
end-to-end tests (test_streaming_input.py)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.bench.counted_s3 import CountedS3, counted_s3
from workload.contract.config import InputConfig
from workload.files import storage
from workload.files.pinned import InputChangedError
from workload.files.rows import InputError
from workload.files.storage import Location
from workload.job import input_plan
from workload.job.input_plan import InputPlan, hash_moved_files, input_changes, plan_input
from workload.job.input_stream import (
    KEY_BITS,
    RecordReader,
    _FactsCollector,
    _hash_unread,
    _records_per_file,
    positions_of,
)


def _id_pass_counts(plan: InputPlan) -> InputPlan:
    """The id pass's reads of every file (keyed rows, counted per file by its collector; hashed as read), then its
    counted plan with the digests."""
    keyed = [replace(f, first=index << KEY_BITS) for index, f in enumerate(plan.files)]
    collector = _FactsCollector()
    source = RecordReader(keyed, shard_rows=1, shards=None, digests=collector.add_digest)
    for file in [f for f in keyed if f.records != 0]:  # as the id pass reads them
        with source._open_input_source(None, file.path) as stream:
            for block in source._read_stream(stream, file.path):
                records = _records_per_file(block.column("_pos"))
                collector.add(block.column("_pos")[0].as_py(), _FactsCollector().facts, records)
                collector.add(block.column("_pos")[0].as_py(), _FactsCollector().facts, records)  # a retried task
    _, records = collector.result()
    counted = plan.with_counts([records.get(index, 0) for index in range(len(plan.files))])
    return _hash_unread(counted.with_digests(collector.digests_found()))


@pytest.fixture(scope="module")
def counting() -> Iterator[CountedS3]:
    """One counting S3 server for this module's tests of what a read fetches (each takes its own counts)."""
    with counted_s3() as s3:
        yield s3


@pytest.fixture
def on_counting(counting: CountedS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountedS3]:
    """The counting server as this process's S3 for one test."""
    for name, value in counting.env.items():
        monkeypatch.setenv(name, value)
    storage.s3_client.cache_clear()  # the process's client, made for this server (and again after)
    counting.take()
    yield counting
    storage.s3_client.cache_clear()


def _sha256(path: Path) -> str:
    return f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def test_the_id_pass_hashes_every_file_and_a_resume_tells_a_copy_from_an_edit(tmp_path: Path) -> None:
    """Issue 59, finding 2, without the engine: the digests the id pass records are the sha256 of each file's bytes
    (JSONL as streamed, Parquet read whole, an empty Parquet file on the driver); a rerun that lists a file at
    another version hashes it: the same bytes keep their count, other bytes are named with both digests."""
    a, c, e = tmp_path / "a.jsonl", tmp_path / "c.parquet", tmp_path / "e.parquet"
    a.write_bytes(b'\xef\xbb\xbf{"id": 0}\n\n{"id": 1}\r\n')
    pq.write_table(pa.table({"id": ["p0", "p1"]}), c)
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), e)  # no rows: the pass never reads it
    first = _id_pass_counts(plan_input(InputConfig(uri=str(tmp_path))))
    assert [f.digest for f in first.files] == [_sha256(a), _sha256(c), _sha256(e)]
    recorded = first.listing()

    def copied_again(body: bytes) -> None:
        before = a.stat().st_mtime_ns
        a.write_bytes(body)
        os.utime(a, ns=(before, before + 1_000_000_000))

    copied_again(a.read_bytes())
    again = hash_moved_files(plan_input(InputConfig(uri=str(tmp_path)), recorded), recorded)
    assert again.files[0].version != recorded[str(a)]["version"] and again.counted and again.rows_in == 4
    assert input_changes(recorded, again.listing()) == []

    old = _sha256(a)
    copied_again(a.read_bytes().replace(b'"id": 1', b'"id": 2'))  # one byte, the same size
    edited = hash_moved_files(plan_input(InputConfig(uri=str(tmp_path)), recorded), recorded)
    assert not edited.counted  # the edited file's count is the id pass's again
    assert input_changes(recorded, edited.listing()) == [f"{a} (content changed: {old} before, {_sha256(a)} now)"]
    # An output recorded before digests were: a moved version cannot be judged, and is refused saying so.
    legacy = {uri: {k: v for k, v in entry.items() if k != "digest"} for uri, entry in recorded.items()}
    now = hash_moved_files(plan_input(InputConfig(uri=str(tmp_path)), legacy), legacy).listing()
    [refusal] = input_changes(legacy, now)
    assert refusal.startswith(f"{a} (content changed: version ") and "no digest recorded" in refusal
    # An output stopped before its id pass ended never counted the file, so no row of it was placed: taken.
    uncounted = {uri: {**entry, "records": None} for uri, entry in legacy.items()}
    assert input_changes(uncounted, now) == []


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


def test_the_plan_reads_no_jsonl_row(tmp_path: Path, on_counting: CountedS3) -> None:
    """Found in issue 50: the plan's count read every input file whole, a read of its own before the id pass read
    them all again. Now the plan lists them; only the OpenAI-dialect check reads the first line of the first, and
    (issue 50, again) by one ranged GET of FIRST_LINE_BYTES, where it fetched up to 4 MiB on every attempt."""
    folder, big_first = tmp_path / "in", tmp_path / "big-first"
    folder.mkdir()
    big_first.mkdir()
    (folder / "a.jsonl").write_bytes(b'{"id": "a", "prompt": "p"}\n')
    (folder / "b.jsonl").write_bytes(b'{"id": "b", "prompt": "p"}\n' * 40_000)  # about 1 MiB
    (big_first / "a.jsonl").write_bytes((folder / "b.jsonl").read_bytes())
    s3 = on_counting
    uri, big_uri = s3.upload(folder, "plan"), s3.upload(big_first, "big-first")
    plan = plan_input(InputConfig(uri=uri))
    counts = s3.take()
    big = plan_input(InputConfig(uri=big_uri))
    big_counts = s3.take()
    assert [f.records for f in plan.files] == [None, None] and big.rows_in is None
    assert counts.get("object_get_bytes", 0) <= (folder / "a.jsonl").stat().st_size, counts
    assert big_counts.get("object_get") == 1, big_counts
    assert 0 < big_counts["object_get_bytes"] <= input_plan.FIRST_LINE_BYTES, big_counts


def test_the_id_pass_reads_a_parquet_file_it_hashes_once(tmp_path: Path, on_counting: CountedS3) -> None:
    """Found in issue 50: the id pass read a Parquet file by ranges for its rows, then once more front to back for
    its digest. A file up to PARQUET_WHOLE_BYTES is now read whole in one pinned GET, hashed and parsed from memory;
    a resume that knows its digest reads it by ranges as before."""
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"id": f"p{i}", "prompt": "x" * 64} for i in range(500)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "rows.parquet", row_group_size=100)
    size = (folder / "rows.parquet").stat().st_size
    s3 = on_counting
    uri = s3.upload(folder, "parquet")
    listed = plan_input(InputConfig(uri=uri))  # the footer's count: ranged GETs of the plan's own
    s3.take()
    counted = _id_pass_counts(listed)
    first = s3.take()
    _id_pass_counts(plan_input(InputConfig(uri=uri), counted.listing()))  # a resume: digest known, no hashing
    again = s3.take()
    assert counted.rows_in == 500 and counted.files[0].digest == _sha256(folder / "rows.parquet")
    assert (first.get("object_get"), first.get("object_get_bytes")) == (1, size), first
    assert again.get("object_get", 0) > 1 and again.get("object_get_bytes", 0) < 2 * size, again


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


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_dialect_checks_read_is_pinned_to_the_listed_version(
    where: str, tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in issue 50: the OpenAI-dialect check read the first file's first line unpinned, so a file replaced
    after the listing was judged by bytes the id pass would refuse. The replacement lands between the listing and
    that read: the listing is taken, then the file rewritten, then the plan is made from the taken listing (the
    race a concurrent uploader makes, which no single-process test can time otherwise)."""
    first, replaced = (
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n',
        b'{"id": 1}\n',
    )
    if where == "s3":
        bucket = f"dialect-{uuid.uuid4().hex[:8]}"
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="in/a.jsonl", Body=first)
        uri = f"s3://{bucket}/in"
    else:
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "a.jsonl").write_bytes(first)
        uri = str(tmp_path / "in")
    listing = storage.list_versions(uri)
    if where == "s3":
        s3.put_object(Bucket=bucket, Key="in/a.jsonl", Body=replaced)
    else:
        (tmp_path / "in" / "a.jsonl").write_bytes(replaced)
        os.utime(tmp_path / "in" / "a.jsonl", ns=(1, 1))  # a new modification time, whatever the clock's grain
    monkeypatch.setattr(input_plan, "list_versions", lambda _uri: listing)
    with pytest.raises(InputChangedError, match=r"a\.jsonl"):
        plan_input(InputConfig(uri=uri))
