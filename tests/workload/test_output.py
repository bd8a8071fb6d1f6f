"""The shard commit protocol on a local disk and on a real S3-speaking server (moto, over HTTP)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.files.storage import delete_file, list_files, locate, read_bytes, write_bytes_atomic
from workload.job.output import OutputStore

STATS = {"rows_ok": 2, "rows_failed": 1, "input_tokens": 10, "output_tokens": 20, "error_types": {"x": 1}}


@pytest.fixture(params=["local", "s3"])
def output_uri(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "out")
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"out-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/night/2026-11-29"


def _table(ids: list[str]) -> pa.Table:
    return pa.table({"id": ids, "generated_text": [f"answer {i}" for i in ids]})


def _names(store: OutputStore, folder: str) -> list[str]:
    return [f.path.rsplit("/", 1)[-1] for f in list_files(store.root.child(folder))]


def test_commit_publishes_parts_and_marker(output_uri: str) -> None:
    store = OutputStore(output_uri)
    commit = store.commit_shard(3, _table(["a", "b"]), [{"id": "c", "error_type": "x"}], STATS, attempt=1)
    assert commit.files == ["results/part-000003.g0a1.parquet", "errors/part-000003.g0a1.jsonl"]
    assert _names(store, "results") == ["part-000003.g0a1.parquet"]
    assert _names(store, "_commits") == ["shard-000003.g0a1.json"]
    assert _names(store, "_pending") == []
    table = pq.read_table(store.root.child("results", "part-000003.g0a1.parquet").path, filesystem=store.root.fs)
    assert table.column("id").to_pylist() == ["a", "b"]
    errors = read_bytes(store.root.child("errors", "part-000003.g0a1.jsonl")).decode().splitlines()
    assert [json.loads(line)["id"] for line in errors] == ["c"]
    assert set(store.committed()) == {3}


def test_recover_deletes_uncommitted_parts_and_rolls_committed_ones_forward(output_uri: str) -> None:
    store = OutputStore(output_uri)
    committed = store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    # A killed attempt: shard 1 reached _pending/ but no marker; shard 0's file was never moved to results/.
    write_bytes_atomic(store.root.child("_pending", "results", "part-000001.g0a1.parquet"), b"half a shard")
    write_bytes_atomic(store.root.child("results", "part-000002.g0a1.parquet"), b"stray, no marker")
    published = store.root.child("results", "part-000000.g0a1.parquet")
    body = read_bytes(published)
    delete_file(published)
    write_bytes_atomic(store.root.child("_pending", "results", "part-000000.g0a1.parquet"), body)

    commits = store.recover()

    assert set(commits) == {0} and commits[0] == committed
    assert _names(store, "results") == ["part-000000.g0a1.parquet"]
    assert read_bytes(published) == body
    assert list_files(store.root.child("_pending")) == []


def test_reset_removes_only_what_the_job_writes(output_uri: str) -> None:
    store = OutputStore(output_uri)
    store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    store.write_manifest({"attempts": []})
    store.write_summary({"rows_in": 1})
    neighbour = locate(output_uri + "/README.txt")
    write_bytes_atomic(neighbour, b"not ours")
    store.reset({"attempts": []})
    assert store.committed() == {}
    assert store.read_manifest() == {"attempts": [], "generation": 1} and store.read_summary() is None
    for folder in ("results", "errors", "_commits", "_pending"):
        assert _names(store, folder) == []
    assert read_bytes(neighbour) == b"not ours"


def test_a_marker_whose_files_are_gone_is_reported_not_trusted_and_its_shard_redone(output_uri: str, capsys) -> None:
    store = OutputStore(output_uri)
    store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    store.commit_shard(1, _table(["b"]), [{"id": "c", "error_type": "x"}], STATS, attempt=1)
    # Shard 1's result file vanished (deleted by hand, or by an attempt that ran without a lease): its marker
    # names a file that is neither published nor pending.
    delete_file(store.root.child("results", "part-000001.g0a1.parquet"))

    commits = store.recover()

    assert set(commits) == {0}
    assert store.untrusted == {1: ["results/part-000001.g0a1.parquet"]}
    assert "shard 1" in capsys.readouterr().err
    # Nothing of a shard with a marker is deleted: shard 1's surviving errors file and its marker stay.
    assert _names(store, "errors") == ["part-000001.g0a1.jsonl"]
    assert set(store.committed()) == {0, 1}

    # The redo commits shard 1 again without errors: the old commit's errors file and marker must not survive.
    store.commit_shard(1, _table(["b", "c"]), [], STATS, attempt=2)
    assert _names(store, "results") == ["part-000000.g0a1.parquet", "part-000001.g0a2.parquet"]
    assert _names(store, "errors") == []
    assert _names(store, "_commits") == ["shard-000000.g0a1.json", "shard-000001.g0a2.json"]
    assert store.committed()[1].attempt == 2 and store.untrusted == {}


def test_an_output_of_a_thousand_committed_shards_reopens_in_seconds_on_s3(moto_endpoint: str) -> None:
    """Resume lists the markers once and reads them in parallel, rather than one request after another."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    bucket = f"big-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    shards = 1000

    def put(shard: int) -> None:
        part = f"results/part-{shard:06d}.parquet"
        marker = {**STATS, "shard": shard, "attempt": 1, "committed_at": "t", "files": [part]}
        marker["error_types"] = {}
        s3.put_object(Bucket=bucket, Key=f"out/{part}", Body=b"rows")
        s3.put_object(Bucket=bucket, Key=f"out/_commits/shard-{shard:06d}.json", Body=json.dumps(marker).encode())

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(put, range(shards)))
    started = time.monotonic()
    committed = OutputStore(f"s3://{bucket}/out").recover()
    elapsed = time.monotonic() - started
    assert sorted(committed) == list(range(shards))
    assert sum(c.rows_ok for c in committed.values()) == shards * STATS["rows_ok"]
    assert elapsed < 20, f"reopening {shards} shards took {elapsed:.1f} s"
