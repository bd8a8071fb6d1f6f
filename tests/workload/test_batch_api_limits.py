"""Issue 60's limits (findings 3, 4, 5 and 7): presigned URLs signed SigV4, quotas per key answered as OpenAI's
429 and 400, size limits counted while the body is read (the local server's stream, an Upload's declared bytes, on
the local server and on the Lambda front), an Upload's parts put together several at once, and the keyless local
server's refusal of other hosts and other sites.

The real app on a real uvicorn server (the app `python -m workload batch-api` runs: `cli.local_app`), and the
keyless server as `python -m workload batch-api` itself, probed with the official client and httpx; the Lambda
front in-process on API Gateway events over a moto server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import boto3
import httpx
import openai
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.conftest import _free_port
from tests.workload.served_app import ServedApp
from tests.workload.test_batch_api import KEY_A, KEY_B, Clock, _line
from tests.workload.test_batch_api_lambda import Front as LambdaFront
from tests.workload.test_batch_api_lambda import stack  # noqa: F401 (the fixture)
from tools import upload_complete_timing
from workload.auth.keys import ApiKeys, KeySource
from workload.batch_api import lambda_front
from workload.batch_api.cli import local_app
from workload.batch_api.executor import LocalJobExecutor
from workload.batch_api.host_guard import served_hosts
from workload.batch_api.objects import ApiError, Limits
from workload.batch_api.quotas import Quotas
from workload.batch_api.s3_store import PART_BYTES, S3Store, s3_client
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore

CHAT = "/v1/chat/completions"


class BodyRead:
    """Counts the request body bytes the app pulls from the server (ASGI `http.request` messages): what it read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.bytes = app, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            self.bytes += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


class Local:
    """The local server's app on uvicorn over a LocalStore, keys from a file: two tenants (key scope)."""

    def __init__(self, tmp: Path, limits: Limits, quotas: Quotas) -> None:
        self.store = LocalStore(tmp / "data")
        # The real local executor; nothing ticks here, so it never starts a job.
        service = BatchService(self.store, LocalJobExecutor({}, tmp / "runs"), "llm-batch", limits, Clock(), quotas)
        (tmp / "keys").write_text(f"{KEY_A}\n{KEY_B}\n")
        keys = ApiKeys(KeySource(key=None, key_file=tmp / "keys"))
        self.read = BodyRead(local_app(service, keys, "key", served_hosts("127.0.0.1")))
        self.served = ServedApp(self.read)
        self.base = self.served.base

    def client(self, key: str = KEY_A) -> openai.OpenAI:
        return self.served.client(key)

    def stop(self) -> None:
        self.served.stop()
        self.store.close()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    quotas = Quotas(
        open_batches=2, enqueued_requests=5, files=4, open_uploads=1, upload_parts=2, max_n=2, max_tokens=64
    )
    running = Local(tmp_path, Limits(max_file_bytes=1024 * 1024), quotas)
    yield running
    running.stop()


def _file(client: openai.OpenAI, lines: int, **body: object) -> str:
    text = "".join(_line(f"r{i}") for i in range(lines))
    if body:
        rows = [json.loads(row) for row in text.splitlines()]
        rows[-1]["body"].update(body)
        text = "".join(json.dumps(row) + "\n" for row in rows)
    return client.files.create(file=("in.jsonl", text.encode()), purpose="batch").id


# ---- finding 3: presigned URLs ------------------------------------------------------------------------------------


def test_the_fronts_presigned_urls_are_sigv4(stack: dict[str, str]) -> None:  # noqa: F811
    """botocore presigns SigV2 in us-east-1 by default, which S3 refuses for SSE-KMS objects; moto takes both, so
    the URL's query is what is checked."""
    url = lambda_front.build_service(stack).store.download_url("files/file-0123456789abcdef01234567.jsonl")  # type: ignore[attr-defined]
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and "Signature" not in query, url
    plain = S3Store(boto3.client("s3"), stack["LLM_BATCH_BUCKET"])  # a client built without the SigV4 config
    with pytest.raises(ValueError, match="signature_version='s3v4'"):
        plain.download_url("files/x.jsonl")


# ---- finding 4: quotas per key ------------------------------------------------------------------------------------


def test_quotas_per_key_are_openais_429_and_request_bounds_its_400(local: Local) -> None:
    client, other = local.client(), local.client(KEY_B)
    first, second = _file(client, 2), _file(client, 2)
    for input_file in (first, second):
        client.batches.create(input_file_id=input_file, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.RateLimitError) as batches:  # two open batches is the quota
        client.batches.create(input_file_id=first, endpoint=CHAT, completion_window="24h")
    assert batches.value.code == "rate_limit_exceeded" and "2 open batches" in batches.value.message
    other_file = _file(other, 2)  # another key holds nothing yet
    assert other.batches.create(input_file_id=other_file, endpoint=CHAT, completion_window="24h").status == "validating"

    queued = client.batches.list().data[0]
    assert client.batches.cancel(queued.id).status == "cancelled"  # one open batch of 2 requests left
    four = _file(client, 4)
    with pytest.raises(openai.RateLimitError, match="2 enqueued requests; it may hold at most 5"):
        client.batches.create(input_file_id=four, endpoint=CHAT, completion_window="24h")
    _file(client, 1)  # the key's fourth file: its quota
    with pytest.raises(openai.RateLimitError, match="4 files"):
        _file(client, 1)

    for field, value in (("n", 3), ("max_tokens", 65), ("max_completion_tokens", 65), ("max_output_tokens", 99)):
        client.files.delete(four)
        four = _file(client, 2, **{field: value})
        with pytest.raises(openai.BadRequestError) as bound:
            client.batches.create(input_file_id=four, endpoint=CHAT, completion_window="24h")
        assert bound.value.param == field and "- line 2: body." in bound.value.message, bound.value.message

    client.files.delete(four)  # an Upload is a file to come: it needs room under the file quota
    upload = client.uploads.create(bytes=10, filename="u.jsonl", mime_type="application/jsonl", purpose="batch")
    with pytest.raises(openai.RateLimitError, match="1 pending uploads"):
        client.uploads.create(bytes=10, filename="v.jsonl", mime_type="application/jsonl", purpose="batch")
    for _ in range(2):
        client.uploads.parts.create(upload.id, data=b"x")
    with pytest.raises(openai.RateLimitError, match="2 parts"):
        client.uploads.parts.create(upload.id, data=b"x")


def test_the_stored_bytes_quota_is_counted_as_the_file_streams(tmp_path: Path) -> None:
    running = Local(tmp_path, Limits(), Quotas(file_bytes=3000))
    try:
        client = running.client()
        client.files.create(file=("a.jsonl", b"x" * 2000), purpose="batch")
        with pytest.raises(openai.RateLimitError, match="1000 bytes this key's quota"):
            client.files.create(file=("b.jsonl", b"x" * 1001), purpose="batch")
        with pytest.raises(openai.RateLimitError, match="this upload declares 1001"):
            client.uploads.create(bytes=1001, filename="c.jsonl", mime_type="application/jsonl", purpose="batch")
        assert [f.bytes for f in client.files.list()] == [2000]  # the refused body left nothing behind
    finally:
        running.stop()


# ---- finding 5: size limits while reading --------------------------------------------------------------------------


def test_a_chunked_upload_is_refused_at_the_cap_not_spooled(local: Local) -> None:
    """300 MB sent chunked (no Content-Length to check up front), generated as it is sent: the app stops reading at
    the server's 1 MiB limit (uvicorn drains and drops the rest of the body it was sent, holding none of it)."""
    boundary, sent = "limitsboundary", 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        chunk = b"x" * (1 << 20)
        for _ in range(300):
            sent += len(chunk)
            yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"authorization": f"Bearer {KEY_A}", "content-type": f"multipart/form-data; boundary={boundary}"}
    try:
        answer = httpx.post(f"{local.base}/v1/files", content=body(), headers=headers, timeout=60)
        status: int | None = answer.status_code
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):  # closed on the rest of the body
        status = None
    assert status in (413, None), status
    assert local.read.bytes < 2 * (1 << 20), f"{local.read.bytes / 1e6:.0f} MB read before the refusal"
    assert local.client().files.list().data == []


def test_a_part_past_the_uploads_declared_bytes_is_refused(local: Local) -> None:
    client = local.client()
    upload = client.uploads.create(bytes=1, filename="one.jsonl", mime_type="application/jsonl", purpose="batch")
    with pytest.raises(openai.BadRequestError, match="more than the 1 bytes") as past:
        client.uploads.parts.create(upload.id, data=b"xy")
    assert past.value.param == "data"
    part = client.uploads.parts.create(upload.id, data=b"x")
    with pytest.raises(openai.BadRequestError, match="more than the 1 bytes"):
        client.uploads.parts.create(upload.id, data=b"x")
    assert local.store.list_blobs(f"uploads/{upload.id}") == [f"uploads/{upload.id}/{part.id}"]


def test_the_lambda_front_refuses_parts_past_the_declared_bytes(stack: dict[str, str]) -> None:  # noqa: F811
    front = LambdaFront(lambda_front.build_handler(stack))
    create = {"bytes": 1, "filename": "one.jsonl", "mime_type": "application/jsonl", "purpose": "batch"}
    status, _, raw = front.call("POST", "/v1/uploads", json=create)
    upload = json.loads(raw)["id"]
    status, _, raw = front.call("POST", f"/v1/uploads/{upload}/parts", files={"data": ("blob", b"x" * 4096)})
    assert status == 400 and json.loads(raw)["error"]["param"] == "data", raw
    listed = boto3.client("s3").list_objects_v2(Bucket=stack["LLM_BATCH_BUCKET"], Prefix=f"batch-api/uploads/{upload}")
    assert listed.get("KeyCount", 0) == 0  # nothing of the refused part stored


# ---- finding 7: the keyless loopback server against browsers --------------------------------------------------------


def test_the_keyless_server_refuses_other_hosts_and_other_sites(tmp_path: Path) -> None:
    """`python -m workload batch-api` as a user starts it, without a key: loopback only, said in its first line;
    a rebound name gets 403, and so does what another site's page can send without a preflight (a text/plain
    POST with the browser's Origin), which creates no batch. A name given with --allowed-host is served."""
    port = _free_port()
    command = [sys.executable, "-m", "workload", "batch-api", "--port", str(port), "--data", str(tmp_path / "d")]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLM_BATCH_API_KEY")}
    server = subprocess.Popen(
        [*command, "--allowed-host", "batch.test"], env=environment, stderr=subprocess.PIPE, text=True
    )
    try:
        assert server.stderr is not None
        banner = server.stderr.readline()
        assert "no key (loopback only)" in banner and "hosts 127.0.0.1, ::1, batch.test, localhost" in banner, banner
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/health")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.1)
        files = f"{base}/v1/files"
        rebound = httpx.get(files, headers={"host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
        for name in ("localhost", "batch.test"):
            assert httpx.get(files, headers={"host": f"{name}:{port}"}).status_code == 200, name

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="no-key-needed", max_retries=0)
        input_file = _file(client, 1)
        simple = {"input_file_id": input_file, "endpoint": CHAT, "completion_window": "24h"}
        for headers in ({"origin": "https://evil.example"}, {"origin": "null"}, {"sec-fetch-site": "cross-site"}):
            csrf = httpx.post(
                f"{base}/v1/batches", content=json.dumps(simple), headers={"content-type": "text/plain", **headers}
            )
            assert csrf.status_code == 403 and csrf.json()["error"]["code"] == "cross_site_request", headers
        assert client.batches.list().data == []
        browser = openai.OpenAI(
            base_url=f"{base}/v1", api_key="x", max_retries=0, default_headers={"origin": "http://a.example"}
        )
        with pytest.raises(openai.PermissionDeniedError):
            browser.files.list()
        assert httpx.get(files, headers={"origin": f"http://127.0.0.1:{port}"}).status_code == 200  # its own page
    finally:
        server.terminate()
        server.wait(30)
    assert served_hosts("0.0.0.0", ["batch.internal"]) == {"0.0.0.0", "batch.internal"}
    assert "localhost" in served_hosts("::1")


def test_an_uploads_parts_go_together_in_order_with_parts_sent_at_once(moto_endpoint: str) -> None:
    """The complete reads parts several at once and S3Store sends its 8 MiB parts several at once: 20 MB in the
    front's 4 MiB parts comes out whole and in order (the md5 given is checked), in three S3 parts. The 200 MB
    figure is the tool's (`python tools/upload_complete_timing.py`), timed on moto."""
    client = s3_client(boto3, endpoint_url=moto_endpoint)
    result = upload_complete_timing.time_complete(client, 20 * 1000 * 1000)
    assert (result["status"], result["parts"]) == ("completed", 5), result
    (made,) = [o for o in client.list_objects_v2(Bucket="upload-timing")["Contents"] if "/files/" in o["Key"]]
    assert made["Size"] == 20 * 1000 * 1000 and made["ETag"].strip('"').endswith("-3")  # a 3-part multipart object


def test_a_body_that_fails_midway_leaves_no_parts_behind(moto_endpoint: str) -> None:
    client = s3_client(boto3, endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="failing-body")
    store = S3Store(client, "failing-body")

    def body() -> Iterator[bytes]:
        for _ in range(3):  # three parts' worth sent, then the stream breaks (a refused body, a lost client)
            yield b"x" * PART_BYTES
        raise ApiError(413, "the body broke off")

    with pytest.raises(ApiError, match="broke off"):
        store.write_blob("files/broken.jsonl", body())
    assert client.list_multipart_uploads(Bucket="failing-body").get("Uploads", []) == []
    assert client.list_objects_v2(Bucket="failing-body").get("KeyCount", 0) == 0
