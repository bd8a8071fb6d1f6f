"""Files of OpenAI's size through a front that takes a few MB a request: the official client's chunked upload
(OpenAI's Uploads API) and a download answered by a redirect the client follows to the store's presigned URL.
The real app on a real uvicorn server, over LocalStore and over S3Store on a moto server."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import openai
import pytest

from tests.workload.served_app import ServedApp
from tests.workload.test_batch_api import KEY_A, Clock, _line
from workload.auth.keys import ApiKeys, KeySource
from workload.batch_api import uploads
from workload.batch_api.app import build_app
from workload.batch_api.executor import LocalJobExecutor
from workload.batch_api.objects import Limits
from workload.batch_api.s3_store import S3Store, s3_client
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore, Store


class Front:
    """The app on uvicorn over `store`, its keys in a file, its clock moved by the test."""

    def __init__(self, tmp: Path, store: Store, limits: Limits) -> None:
        self.clock, self.store = Clock(), store
        # The real local executor; nothing here ticks a batch into a run, so it never starts a job.
        self.service = BatchService(store, LocalJobExecutor({}, tmp / "runs"), "llm-batch", limits, self.clock)
        (tmp / "keys").write_text(f"{KEY_A}\n")
        app = build_app(self.service, ApiKeys(KeySource(key=None, key_file=tmp / "keys")))
        self.served = ServedApp(app)
        self.base = f"{self.served.base}/v1"

    def client(self) -> openai.OpenAI:
        return self.served.client(KEY_A)

    def stop(self) -> None:
        self.served.stop()


@pytest.fixture(params=["local", "s3"])
def front(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Front]:
    store: Store
    if request.param == "local":
        store = LocalStore(tmp_path / "data")
    else:
        client = s3_client(boto3, endpoint_url=request.getfixturevalue("moto_endpoint"), region_name="us-east-1")
        bucket = f"uploads-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        store = S3Store(client, bucket)
    running = Front(tmp_path, store, Limits(inline_download_bytes=1024))
    yield running
    running.stop()
    if isinstance(store, LocalStore):
        store.close()


def _jsonl(lines: int) -> bytes:
    return "".join(_line(f"r{i}") for i in range(lines)).encode()


def test_the_sdks_chunked_upload_makes_a_file_a_batch_takes(front: Front) -> None:
    client, body = front.client(), _jsonl(40)  # about 6 KB in parts of 1 KB: seven parts
    md5 = hashlib.md5(body, usedforsecurity=False).hexdigest()
    done = client.uploads.upload_file_chunked(
        file=body, filename="night.jsonl", bytes=len(body), mime_type="application/jsonl", purpose="batch",
        part_size=1024, md5=md5,
    )  # fmt: skip
    assert done.status == "completed" and done.file is not None
    assert (done.file.bytes, done.file.filename, done.file.purpose) == (len(body), "night.jsonl", "batch")
    assert client.files.retrieve(done.file.id) == done.file
    assert client.files.content(done.file.id).content == body
    batch = client.batches.create(input_file_id=done.file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert (batch.status, batch.request_counts and batch.request_counts.total) == ("validating", 40)
    assert front.store.list_blobs(f"uploads/{done.id}") == []  # the parts went once the file was made


def test_uploads_refuse_what_does_not_add_up(front: Front) -> None:
    client, body = front.client(), _jsonl(3)
    upload = client.uploads.create(
        bytes=len(body) + 1, filename="x.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    part = client.uploads.parts.create(upload.id, data=body)
    with pytest.raises(openai.BadRequestError, match=f"hold {len(body)} bytes"):
        client.uploads.complete(upload.id, part_ids=[part.id])
    with pytest.raises(openai.BadRequestError, match="not a part of upload"):
        client.uploads.complete(upload.id, part_ids=["part_nothere"])
    assert client.uploads.cancel(upload.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError, match="is cancelled"):
        client.uploads.parts.create(upload.id, data=body)
    assert front.store.list_blobs(f"uploads/{upload.id}") == []
    with pytest.raises(openai.BadRequestError, match="over this server's limit"):
        client.uploads.create(bytes=300 * 10**6, filename="x.jsonl", mime_type="application/jsonl", purpose="batch")
    with pytest.raises(openai.BadRequestError) as purpose:
        client.uploads.create(bytes=10, filename="x.jsonl", mime_type="application/jsonl", purpose="assistants")
    assert purpose.value.param == "purpose"
    good = client.uploads.create(bytes=len(body), filename="y.jsonl", mime_type="application/jsonl", purpose="batch")
    good_part = client.uploads.parts.create(good.id, data=body)
    with pytest.raises(openai.BadRequestError, match="does not match the md5"):
        client.uploads.complete(good.id, part_ids=[good_part.id], md5="0" * 32)
    assert [f.filename for f in client.files.list()] == []  # the refused complete left no file behind
    assert client.uploads.complete(good.id, part_ids=[good_part.id]).status == "completed"


def test_an_upload_left_pending_expires_with_its_parts(front: Front) -> None:
    client = front.client()
    upload = client.uploads.create(bytes=10, filename="x.jsonl", mime_type="application/jsonl", purpose="batch")
    client.uploads.parts.create(upload.id, data=b"0123456789")
    front.clock.now += uploads.UPLOAD_TTL_S
    with pytest.raises(openai.BadRequestError, match="expired"):
        client.uploads.parts.create(upload.id, data=b"0")
    front.service.tick()
    assert front.store.list_blobs(f"uploads/{upload.id}") == [] and front.store.records("upload") == []


def test_a_large_download_is_a_redirect_the_client_follows(front: Front) -> None:
    client, body = front.client(), _jsonl(30)  # over the 1 KB inline limit of this front
    created = client.files.create(file=("big.jsonl", body), purpose="batch")
    small = client.files.create(file=("small.jsonl", _jsonl(1)), purpose="batch")
    raw = httpx.get(f"{front.base}/files/{created.id}/content", headers={"Authorization": f"Bearer {KEY_A}"})
    if isinstance(front.store, S3Store):
        assert raw.status_code == 307 and raw.headers["location"].startswith(front.store.s3.meta.endpoint_url)
        assert "X-Amz-Signature" in raw.headers["location"] or "Signature=" in raw.headers["location"]
    else:  # a folder has no URL to send the client to: answered inline
        assert raw.status_code == 200 and raw.content == body
    assert client.files.content(created.id).content == body  # the official client follows it
    inline = httpx.get(f"{front.base}/files/{small.id}/content", headers={"Authorization": f"Bearer {KEY_A}"})
    assert inline.status_code == 200 and json.loads(inline.content)["custom_id"] == "r0"
