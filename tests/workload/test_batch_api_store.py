"""The `Store` contract, held by both stores: `LocalStore` (a folder) and `S3Store` (a bucket on a moto server,
with S3's own conditional writes and multipart uploads)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from workload.batch_api import s3_store
from workload.batch_api.s3_store import S3Store
from workload.batch_api.store import CAS_TRIES, LocalStore, Store, StoreConflict, update_record


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "local":
        local = LocalStore(tmp_path / "data")
        yield local
        local.close()
        return
    endpoint = request.getfixturevalue("moto_endpoint")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"store-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    yield S3Store(client, bucket, "batch-api/")


def _record(object_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": object_id, "created_at": 1, "_seq": 1, **fields}


def test_put_creates_once_and_changes_only_the_version_read(store: Store) -> None:
    first = store.put("batch", _record("batch_a", status="validating"), None)
    with pytest.raises(StoreConflict):  # create again: it exists
        store.put("batch", _record("batch_a", status="validating"), None)
    second = store.put("batch", _record("batch_a", status="in_progress"), first)
    assert second != first
    with pytest.raises(StoreConflict):  # a change from the stale version loses
        store.put("batch", _record("batch_a", status="cancelled"), first)
    found = store.get("batch", "batch_a")
    assert found is not None and found.version == second and found.record["status"] == "in_progress"
    assert store.get("batch", "batch_nothere") is None and store.get("batch", "../x") is None


def test_racing_writers_lose_no_write(store: Store) -> None:
    """Eight threads each add one to a counter through update_record's compare-and-swap: the count is eight."""
    store.put("batch", _record("batch_n", count=0), None)

    def add_one() -> None:
        update_record(store, "batch", "batch_n", lambda record: record.update(count=record["count"] + 1), KeyError())

    threads = [threading.Thread(target=add_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = store.get("batch", "batch_n")
    assert found is not None and found.record["count"] == 8


def test_a_change_that_always_loses_its_race_ends_named(store: Store) -> None:
    """A record some other writer changes before every write: the change gives up after CAS_TRIES reads, naming
    the record, instead of spinning."""
    store.put("batch", _record("batch_busy", count=0), None)
    reads = 0

    def rival_writes_first(record: dict[str, Any]) -> None:
        nonlocal reads
        reads += 1
        found = store.get("batch", "batch_busy")
        assert found is not None
        store.put("batch", {**found.record, "count": found.record["count"] + 1}, found.version)

    with pytest.raises(StoreConflict, match=f"batch batch_busy: changed by another writer on each of {CAS_TRIES}"):
        update_record(store, "batch", "batch_busy", rival_writes_first, KeyError())
    assert reads == CAS_TRIES


def test_records_lists_one_kind_and_delete_removes(store: Store) -> None:
    for name in ("file-b", "file-a", "file-c"):
        store.put("file", _record(name), None)
    store.put("batch", _record("batch_x"), None)
    assert [r["id"] for r in store.records("file")] == ["file-a", "file-b", "file-c"]
    store.delete("file", "file-b")
    assert [r["id"] for r in store.records("file")] == ["file-a", "file-c"]
    assert [r["id"] for r in store.records("upload")] == []


def test_blobs_multipart_all_or_nothing_list_and_delete(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_store, "PART_BYTES", 5 * 1024 * 1024)  # S3's smallest part: three parts here
    body = [secrets.token_bytes(1024 * 1024) for _ in range(11)]
    assert store.write_blob("files/big.jsonl", iter(body)) == 11 * 1024 * 1024
    assert store.blob_size("files/big.jsonl") == 11 * 1024 * 1024
    read = store.read_blob("files/big.jsonl")
    assert read is not None and b"".join(read) == b"".join(body)

    def broken() -> Iterator[bytes]:
        yield from body[:6]
        raise RuntimeError("the client went away")

    with pytest.raises(RuntimeError):
        store.write_blob("files/torn.jsonl", broken())
    assert store.blob_size("files/torn.jsonl") is None and store.read_blob("files/torn.jsonl") is None
    if isinstance(store, S3Store):  # the aborted upload leaves no parts to pay for
        assert store.s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
    assert store.write_blob("batches/b/output/empty.jsonl", iter([])) == 0
    store.write_blob("batches/b/output/output.jsonl", iter([b"x\n"]))
    store.write_blob("batches/b/output/_commits/0.json", iter([b"{}"]))
    assert store.list_blobs("batches/b/output") == [
        "batches/b/output/_commits/0.json",
        "batches/b/output/empty.jsonl",
        "batches/b/output/output.jsonl",
    ]
    store.delete_blobs("batches/b/output")
    store.delete_blobs("files/big.jsonl")
    assert store.list_blobs("batches/b/output") == [] and store.blob_size("files/big.jsonl") is None


def test_uri_names_where_the_job_reads(store: Store) -> None:
    uri = store.uri("files/f.jsonl")
    if isinstance(store, S3Store):
        assert uri == f"s3://{store.bucket}/batch-api/files/f.jsonl"
    else:
        assert uri.endswith("/data/files/f.jsonl")
    with pytest.raises(ValueError, match="not a key"):
        store.uri("../outside")
