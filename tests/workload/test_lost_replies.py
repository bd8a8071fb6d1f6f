"""A lost reply is not a lost write: every conditional write and delete, in the job's output and in the Batch API's
store, recognises its own applied request when botocore retries it.

moto (a real S3-speaking server) sits behind tests/lost_reply.py's proxy, which lets a chosen request apply and
drops its reply: the client's retry then carries the same If-Match / If-None-Match and finds its own write there.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import boto3
import pytest
from botocore.exceptions import ConnectionClosedError

from tests.lost_reply import LostReplyProxy
from workload.batch_api.executor import LocalJobExecutor
from workload.batch_api.s3_store import PART_BYTES, S3Store
from workload.batch_api.service import BatchService
from workload.batch_api.store import update_record
from workload.files.storage import locate, read_versioned, s3_client
from workload.job.lease import OutputLease
from workload.job.output import FAILURE, MANIFEST, SUMMARY, OutputFencedError, OutputStore


def _bucket() -> str:
    bucket = f"lost-{secrets.token_hex(4)}"
    s3_client().create_bucket(Bucket=bucket)
    return bucket


def _stored(uri: str) -> Any:
    found = read_versioned(locate(uri))
    return None if found is None else json.loads(found[0])


# ---- the job's output ------------------------------------------------------------------------------------------


def test_the_outputs_conditional_writes_survive_a_lost_reply(lost_reply: LostReplyProxy) -> None:
    root = f"s3://{_bucket()}/out"
    output = OutputStore(root)
    output.read_manifest()
    lost_reply.lose("PUT", MANIFEST, header="If-None-Match")  # the first manifest: a create
    output.write_manifest({"config": "a"})
    lost_reply.lose("PUT", MANIFEST, header="If-Match")  # rewritten after each commit and every 30 s
    output.write_manifest({"config": "b"})
    output.write_manifest({"config": "c"})  # the version kept after the lost reply is the one stored
    lost_reply.lose("PUT", "output.jsonl", header="If-None-Match")
    output.write_file("output.jsonl", b'{"custom_id": "r1"}\n')
    lost_reply.lose("PUT", SUMMARY, header="If-None-Match")
    output.write_summary({"rows_ok": 1})
    assert lost_reply.armed() == 0 and len(lost_reply.dropped) == 4
    assert _stored(f"{root}/{MANIFEST}") == {"config": "c"}
    assert _stored(f"{root}/{SUMMARY}")["rows_ok"] == 1
    assert read_versioned(locate(f"{root}/output.jsonl")) is not None


def test_the_outputs_conditional_delete_survives_a_lost_reply(lost_reply: LostReplyProxy) -> None:
    root = f"s3://{_bucket()}/out"
    output = OutputStore(root)
    output.read_manifest()
    output.write_manifest({"config": "a"})
    output.write_failure("EngineError", "the engine died")
    lost_reply.lose("DELETE", FAILURE)  # applied; the retry finds nothing to delete
    output.clear_notes()
    assert lost_reply.armed() == 0
    assert read_versioned(locate(f"{root}/{FAILURE}")) is None
    output.write_failure("EngineError", "again")  # the store knows the note is gone: it creates it anew


def test_another_attempts_write_is_still_a_conflict(lost_reply: LostReplyProxy) -> None:
    root = f"s3://{_bucket()}/out"
    output = OutputStore(root)
    output.read_manifest()
    output.write_manifest({"config": "a"})
    successor = OutputStore(root)
    successor.read_manifest()
    successor.write_manifest({"config": "successor"})
    lost_reply.lose("PUT", MANIFEST, header="If-Match")  # lost reply or not, the stored write is not ours
    with pytest.raises(OutputFencedError, match="changed by another attempt"):
        output.write_manifest({"config": "stale"})
    assert _stored(f"{root}/{MANIFEST}") == {"config": "successor"}


def test_the_lease_survives_lost_replies(lost_reply: LostReplyProxy) -> None:
    root = locate(f"s3://{_bucket()}/out")
    lease = OutputLease(root, ttl_s=120)
    lost_reply.lose("PUT", "_lease.json", header="If-None-Match")
    lease.acquire()
    lost_reply.lose("PUT", "_lease.json", header="If-Match")
    lease.renew()
    lease.check()
    lost_reply.lose("DELETE", "_lease.json")
    lease.release()
    assert lost_reply.armed() == 0
    assert read_versioned(root.child("_lease.json")) is None


# ---- the Batch API's store ------------------------------------------------------------------------------------


def _store(proxy: LostReplyProxy) -> S3Store:
    client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1")
    bucket = f"api-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    return S3Store(client, bucket)


def test_a_record_write_survives_a_lost_reply(lost_reply: LostReplyProxy) -> None:
    store = _store(lost_reply)
    lost_reply.lose("PUT", "records/batch/batch_a.json", header="If-None-Match")
    created = store.put("batch", {"id": "batch_a", "n": 1}, None)
    found = store.get("batch", "batch_a")
    assert found is not None and found.version == created

    def add_one(record: dict[str, Any]) -> None:
        record["n"] += 1

    lost_reply.lose("PUT", "records/batch/batch_a.json", header="If-Match")
    assert update_record(store, "batch", "batch_a", add_one, KeyError("batch_a"))["n"] == 2
    found = store.get("batch", "batch_a")
    assert found is not None and found.record["n"] == 2  # applied once, not twice
    assert lost_reply.armed() == 0


def _service(proxy: LostReplyProxy, tmp_path: Any) -> BatchService:
    # The real local executor; nothing here ticks, so no job starts.
    return BatchService(_store(proxy), LocalJobExecutor({}, tmp_path / "runs"), "llm-batch")


def _line(custom_id: str) -> bytes:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": "hi"}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return (json.dumps(line) + "\n").encode()


def test_a_batch_created_under_a_lost_reply_is_one_batch(lost_reply: LostReplyProxy, tmp_path: Any) -> None:
    service = _service(lost_reply, tmp_path)
    source = service.upload_file("p", "in.jsonl", "batch", [_line("r1")])
    lost_reply.lose("PUT", "records/batch/", header="If-None-Match")
    batch = service.create_batch("p", source["id"], "/v1/chat/completions", "24h")
    assert lost_reply.armed() == 0
    assert [b["id"] for b in service.list_batches("p", None, 20)["data"]] == [batch["id"]]
    lost_reply.lose("PUT", f"records/batch/{batch['id']}", header="If-Match")
    assert service.cancel_batch("p", batch["id"])["status"] == "cancelled"  # applied: not a 409


def test_an_upload_completed_under_a_lost_reply_keeps_its_file(lost_reply: LostReplyProxy, tmp_path: Any) -> None:
    service = _service(lost_reply, tmp_path)
    body = _line("r1")
    upload = service.create_upload(
        "p", {"bytes": len(body), "filename": "in.jsonl", "mime_type": "application/jsonl", "purpose": "batch"}
    )
    part = service.add_upload_part("p", upload["id"], [body])
    lost_reply.lose("PUT", f"records/upload/{upload['id']}", header="If-Match")
    done = service.complete_upload("p", upload["id"], [part["id"]], None)
    assert lost_reply.armed() == 0
    assert done["status"] == "completed"
    assert b"".join(service.file_content("p", done["file"]["id"])) == body


def test_a_multipart_body_completed_under_a_lost_reply_is_written(lost_reply: LostReplyProxy) -> None:
    """botocore retries a CompleteMultipartUpload whose reply was lost. S3 answers a repeated complete with the same
    parts 200, the object it made (idempotent on real S3: adobe/S3Mock#2586's script against AWS, minio/minio#13318,
    both read 2026-12-07), and moto does the same, so the write stands with no check of ours; this test fails if
    that ever changes (a NoSuchUpload would fail a written body)."""
    store = _store(lost_reply)
    body = secrets.token_bytes(PART_BYTES + 1024)  # two parts
    lost_reply.lose("POST", "uploadId=")  # the complete (the create is POST ?uploads)
    assert store.write_blob("files/file_a", [body]) == len(body)
    assert lost_reply.armed() == 0
    found = store.read_blob("files/file_a")
    assert found is not None and b"".join(found) == body


def test_a_multipart_body_whose_complete_never_arrives_leaves_the_key_as_it_was(lost_reply: LostReplyProxy) -> None:
    """Every try of the complete lost on its way: the write fails, the upload is aborted (no parts left to pay
    for) and the key keeps the object it had."""
    store = _store(lost_reply)
    store.write_blob("files/file_a", [b"the earlier body"])
    lost_reply.lose("POST", "uploadId=", forward=False, times=20)
    with pytest.raises(ConnectionClosedError):
        store.write_blob("files/file_a", [secrets.token_bytes(PART_BYTES + 1024)])
    assert lost_reply.dropped  # the complete was tried, and lost
    found = store.read_blob("files/file_a")
    assert found is not None and b"".join(found) == b"the earlier body"
    assert not store.s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads")
