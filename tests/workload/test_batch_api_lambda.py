"""The Lambda front in-process, fed API Gateway HTTP API (payload 2.0) events as API Gateway sends them, over the
stack's bucket, key secret and state machine on a moto server (S3, Secrets Manager, Step Functions)."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import httpx2
import openai
import pytest
from openai.types import Model

from tests.infra.nightly_aws import ROLE_ARN
from tests.workload.test_batch_api import _line
from tests.workload.test_batch_api_vision import image_line
from workload.batch_api import lambda_front

KEY = "sk-lambda-" + "0123456789" * 3  # the Batch API takes keys of at least 32 characters
HOST = "abc123.execute-api.us-east-1.amazonaws.com"


def _event(request: httpx.Request | httpx2.Request) -> dict[str, Any]:
    """The event API Gateway's HTTP API gives a Lambda integration for `request` (payload format version 2.0)."""
    url = urlsplit(str(request.url))
    body = request.read()
    headers = {name.lower(): value for name, value in request.headers.items() if name.lower() != "content-length"}
    headers.update(
        {"host": HOST, "x-forwarded-proto": "https", "x-forwarded-port": "443", "content-length": str(len(body))}
    )
    binary = not headers.get("content-type", "").startswith("application/json")
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": url.path,
        "rawQueryString": url.query,
        "headers": headers,
        **({"queryStringParameters": dict(httpx.QueryParams(url.query))} if url.query else {}),
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": HOST,
            "domainPrefix": "abc123",
            "http": {
                "method": request.method,
                "path": url.path,
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.7",
                "userAgent": "OpenAI/Python",
            },
            "requestId": secrets.token_hex(8),
            "routeKey": "$default",
            "stage": "$default",
            "time": "02/Dec/2026:01:00:00 +0000",
            "timeEpoch": 1796173200000,
        },
        **(
            {"body": base64.b64encode(body).decode() if binary else body.decode(), "isBase64Encoded": binary}
            if body
            else {"isBase64Encoded": False}
        ),
    }


class Front:
    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def call(self, method: str, path: str, key: str | None = KEY, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        request = httpx.Request(method, f"https://{HOST}{path}", headers=headers, **kwargs)
        answer = self.handler(_event(request), {})
        body = answer.get("body", "")
        raw = base64.b64decode(body) if answer.get("isBase64Encoded") else body.encode()
        return answer["statusCode"], {k.lower(): v for k, v in answer.get("headers", {}).items()}, raw


def official_client(handler: Any) -> openai.OpenAI:
    """The official client (over httpx2, its HTTP library), each of its requests handed to `handler` as API
    Gateway's event. An event over Lambda's 6 MB payload is answered 413 here, as a stand-in for AWS's own limit
    (nothing local enforces it)."""

    def send(request: httpx2.Request) -> httpx2.Response:
        event = _event(request)
        if len(json.dumps(event)) > lambda_front.LAMBDA_PAYLOAD_BYTES:
            return httpx2.Response(413, json={"message": "Request Entity Too Large"})
        answer = handler(event, {})
        body = answer.get("body", "")
        raw = base64.b64decode(body) if answer.get("isBase64Encoded") else body.encode()
        return httpx2.Response(answer["statusCode"], headers=answer.get("headers", {}), content=raw)

    client = openai.DefaultHttpxClient(transport=httpx2.MockTransport(send))
    return openai.OpenAI(api_key=KEY, base_url=f"https://{HOST}/v1", max_retries=0, http_client=client)


def noise_png(side: int) -> bytes:
    """An image about side * side * 3 bytes as a PNG: random pixels do not compress."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), secrets.token_bytes(side * side * 3)).save(out, "PNG", compress_level=1)
    return out.getvalue()


@pytest.fixture
def stack(moto_endpoint: str) -> dict[str, str]:
    """A stack's pieces the front uses: its bucket, its key secret and its state machine."""
    s3, name = boto3.client("s3"), secrets.token_hex(4)
    bucket = f"llm-batch-{name}"
    s3.create_bucket(Bucket=bucket)
    secret = boto3.client("secretsmanager").create_secret(
        Name=f"llm-batch-{name}-api-keys", SecretString=json.dumps({"keys": [KEY]})
    )
    definition = {"StartAt": "Run", "States": {"Run": {"Type": "Wait", "Seconds": 86400, "End": True}}}
    machine = boto3.client("stepfunctions").create_state_machine(
        name=f"llm-batch-{name}-nightly", definition=json.dumps(definition), roleArn=ROLE_ARN
    )
    return {
        "LLM_BATCH_BUCKET": bucket,
        "LLM_BATCH_STATE_MACHINE_ARN": machine["stateMachineArn"],
        "LLM_BATCH_API_KEY_SECRET": secret["ARN"],
        "LLM_BATCH_MODEL": "llm-batch",
        "LLM_BATCH_STACK": "small",
        "LLM_BATCH_METRICS_NAMESPACE": "LLMBatch",
        "AWS_REGION": "us-east-1",
    }


def test_upload_list_get_download_and_a_batch_over_api_gateway_events(stack: dict[str, str]) -> None:
    front = Front(lambda_front.build_handler(stack))
    body = (_line("a") + _line("b")).encode()
    status, _, raw = front.call("POST", "/v1/files", files={"file": ("in.jsonl", body)}, data={"purpose": "batch"})
    assert status == 200, raw
    created = json.loads(raw)
    assert (created["object"], created["bytes"], created["filename"]) == ("file", len(body), "in.jsonl")
    head = boto3.client("s3").head_object(
        Bucket=stack["LLM_BATCH_BUCKET"], Key=f"batch-api/files/{created['id']}.jsonl"
    )
    assert head["ContentLength"] == len(body)  # in the stack's bucket, under the API's prefix

    status, _, raw = front.call("GET", "/v1/files?limit=5&order=asc")
    assert status == 200 and [f["id"] for f in json.loads(raw)["data"]] == [created["id"]]
    status, _, raw = front.call("GET", f"/v1/files/{created['id']}")
    assert status == 200 and json.loads(raw) == created
    status, _, raw = front.call("GET", f"/v1/files/{created['id']}/content")
    assert status == 200 and raw == body

    status, _, raw = front.call(
        "POST", "/v1/batches",
        json={"input_file_id": created["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    )  # fmt: skip
    assert status == 200 and json.loads(raw)["status"] == "validating"
    batch_id = json.loads(raw)["id"]
    lambda_front.build_service(stack).tick()  # the schedule's tick: the queue's first batch starts its execution
    status, _, raw = front.call("GET", f"/v1/batches/{batch_id}")
    assert json.loads(raw)["status"] == "in_progress"
    sfn = boto3.client("stepfunctions")
    (running,) = sfn.list_executions(stateMachineArn=stack["LLM_BATCH_STATE_MACHINE_ARN"])["executions"]
    assert running["name"].startswith(batch_id) and running["status"] == "RUNNING"


def _assert_runs_as_endpoint(stack: dict[str, str], front: Front, line: dict[str, Any]) -> dict[str, str]:
    """Uploads `line` as a batch file, creates a batch for its `url` and ticks the queue: the night's execution is
    handed that endpoint. The create request, for more batches of the same kind."""
    status, _, raw = front.call(
        "POST", "/v1/files", files={"file": ("in.jsonl", (json.dumps(line) + "\n").encode())}, data={"purpose": "batch"}
    )
    assert status == 200, raw
    request = {"input_file_id": json.loads(raw)["id"], "endpoint": line["url"], "completion_window": "24h"}
    status, _, raw = front.call("POST", "/v1/batches", json=request)
    assert status == 200 and json.loads(raw)["status"] == "validating", raw
    lambda_front.build_service(stack).tick()
    sfn = boto3.client("stepfunctions")
    (running,) = sfn.list_executions(stateMachineArn=stack["LLM_BATCH_STATE_MACHINE_ARN"])["executions"]
    given = json.loads(sfn.describe_execution(executionArn=running["executionArn"])["input"])
    assert given["batch"]["endpoint"] == line["url"] and given["batch"]["id"] == json.loads(raw)["id"]
    return request


def test_an_embeddings_batch_over_api_gateway_events_runs_as_an_embeddings_execution(stack: dict[str, str]) -> None:
    """The AWS front takes `/v1/embeddings` batches (issue 55) and hands the endpoint to the night's execution."""
    line = {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "llm-batch", "input": "x"}}
    _assert_runs_as_endpoint(stack, Front(lambda_front.build_handler(stack)), line)


def test_a_responses_batch_over_api_gateway_events_runs_as_a_responses_execution(stack: dict[str, str]) -> None:
    """The AWS front takes `/v1/responses` batches (issue 56), its per-key bound on output tokens covers
    `max_output_tokens`, and the endpoint reaches the night's execution."""
    front = Front(lambda_front.build_handler(stack))
    body = {"model": "llm-batch", "input": "x", "max_output_tokens": 8}
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/responses", "body": body}
    request = _assert_runs_as_endpoint(stack, front, line)
    over = {**line, "body": {**body, "max_output_tokens": 10**9}}
    status, _, raw = front.call(
        "POST",
        "/v1/files",
        files={"file": ("big.jsonl", (json.dumps(over) + "\n").encode())},
        data={"purpose": "batch"},
    )
    status, _, raw = front.call("POST", "/v1/batches", json={**request, "input_file_id": json.loads(raw)["id"]})
    assert status == 400 and json.loads(raw)["error"]["param"] == "max_output_tokens", raw


def test_the_models_list_comes_from_the_stacks_served_names(stack: dict[str, str]) -> None:
    """GET /v1/models on the AWS front (issue 57): LLM_BATCH_SERVED_MODELS, which the stack sets from the job's
    model, aliases and adapters; unset, the model alone."""
    status, _, raw = Front(lambda_front.build_handler(stack)).call("GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["llm-batch"]
    served = {**stack, "LLM_BATCH_SERVED_MODELS": "llm-batch,gpt-4o-mini,support"}
    status, _, raw = Front(lambda_front.build_handler(served)).call("GET", "/v1/models")
    listed = [Model.model_validate(m) for m in json.loads(raw)["data"]]
    assert status == 200 and [m.id for m in listed] == ["llm-batch", "gpt-4o-mini", "support"]


def test_the_key_is_the_secrets_and_no_route_is_open(stack: dict[str, str]) -> None:
    front = Front(lambda_front.build_handler(stack))
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/uploads"), ("GET", "/v1/batches/batch_x")):
        status, _, raw = front.call(method, path, key="sk-wrong-key-000000")
        assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key", (method, path)
        assert front.call(method, path, key=None)[0] == 401
    assert front.call("GET", "/health", key=None)[0] == 200


def test_a_large_file_by_parts_and_its_download_by_redirect(stack: dict[str, str]) -> None:
    """OpenAI's Uploads API through events, and a download over the front's limit answered with a 307."""
    front = Front(lambda_front.build_handler(stack))
    line = _line("x" * 900)
    body = (line * (lambda_front.FRONT_BODY_BYTES // len(line) + 50)).encode()  # just over one request's limit
    half = len(body) // 2
    create = {"bytes": len(body), "filename": "big.jsonl", "mime_type": "application/jsonl", "purpose": "batch"}
    status, _, raw = front.call("POST", "/v1/uploads", json=create)
    assert status == 200, raw
    upload = json.loads(raw)["id"]
    parts = []
    for piece in (body[:half], body[half:]):
        status, _, raw = front.call("POST", f"/v1/uploads/{upload}/parts", files={"data": ("blob", piece)})
        assert status == 200, raw
        parts.append(json.loads(raw)["id"])
    status, _, raw = front.call("POST", f"/v1/uploads/{upload}/complete", json={"part_ids": parts})
    assert status == 200 and json.loads(raw)["status"] == "completed"
    file = json.loads(raw)["file"]
    assert file["bytes"] == len(body)
    status, headers, raw = front.call("GET", f"/v1/files/{file['id']}/content")
    assert status == 307 and raw == b""
    assert httpx.get(headers["location"]).content == body  # the presigned URL serves the body, no key needed


def test_a_vision_file_comes_through_the_front_in_parts_and_reaches_its_batchs_run_through_the_spec(
    stack: dict[str, str], tmp_path: Path
) -> None:
    """Issue 57 on the tiers, through the official client: an image over one request's limit (and within the job's
    input.max_image_bytes, LLM_BATCH_MAX_IMAGE_BYTES) comes in parts, the front checks the completed file with
    Pillow; a Responses line names it, and the tick's execution runs a pool spec whose member hands the job that
    file id's S3 URI under batch-api/files/ (pools.py), where the job's role reads a batch's files."""
    most = 8 << 20
    env = {**stack, "LLM_BATCH_MAX_IMAGE_BYTES": str(most)}
    client = official_client(lambda_front.build_handler(env))
    image = noise_png(1280)
    assert lambda_front.FRONT_BODY_BYTES < len(image) <= most
    with pytest.raises(openai.APIStatusError) as whole:  # one Lambda request cannot carry it
        client.files.create(file=("cat.png", image), purpose="vision")
    assert whole.value.status_code == 413
    path = tmp_path / "cat.png"
    path.write_bytes(image)
    upload = client.uploads.upload_file_chunked(
        file=path, mime_type="image/png", purpose="vision", part_size=lambda_front.FRONT_BODY_BYTES
    )
    assert upload.status == "completed" and upload.file is not None
    file = upload.file
    assert (file.purpose, file.bytes) == ("vision", len(image))
    bucket, s3 = stack["LLM_BATCH_BUCKET"], boto3.client("s3")
    assert s3.get_object(Bucket=bucket, Key=f"batch-api/files/{file.id}.jsonl")["Body"].read() == image
    with pytest.raises(openai.BadRequestError) as junk:
        client.files.create(file=("cat.png", b"not an image"), purpose="vision")
    assert junk.value.param == "file" and "Pillow" in junk.value.message
    with pytest.raises(openai.BadRequestError) as large:
        client.uploads.create(bytes=most + 1, filename="big.png", mime_type="image/png", purpose="vision")
    assert large.value.param == "bytes" and f"max_image_bytes of {most}" in large.value.message
    assert [f.id for f in client.files.list(purpose="vision")] == [file.id]  # nothing refused was kept

    lines = client.files.create(file=("in.jsonl", image_line("r1", file.id).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=lines.id, endpoint="/v1/responses", completion_window="24h")
    assert batch.status == "validating"
    lambda_front.build_service(env).tick()
    sfn = boto3.client("stepfunctions")
    (running,) = sfn.list_executions(stateMachineArn=stack["LLM_BATCH_STATE_MACHINE_ARN"])["executions"]
    given = json.loads(sfn.describe_execution(executionArn=running["executionArn"])["input"])["batch"]
    assert given["input_key"].startswith("batch-api/files/pools/") and given["input_key"].endswith(".pool.json")
    spec = json.loads(s3.get_object(Bucket=bucket, Key=given["input_key"])["Body"].read())
    (member,) = spec["members"]
    assert member["name"] == batch.id
    assert member["image_files"] == {file.id: f"s3://{bucket}/batch-api/files/{file.id}.jsonl"}
    with pytest.raises(openai.ConflictError):  # its run reads it: kept until the batch has finished
        client.files.delete(file.id)


def test_a_front_without_its_settings_does_not_start(stack: dict[str, str]) -> None:
    with pytest.raises(lambda_front.FrontConfigError, match="LLM_BATCH_API_KEY_SECRET"):
        lambda_front.build_handler({k: v for k, v in stack.items() if k != "LLM_BATCH_API_KEY_SECRET"})
    with pytest.raises(lambda_front.FrontConfigError, match="LLM_BATCH_BUCKET"):
        lambda_front.build_handler({k: v for k, v in stack.items() if k != "LLM_BATCH_BUCKET"})
    with pytest.raises(lambda_front.FrontConfigError, match="LLM_BATCH_API_SCOPE"):
        lambda_front.build_handler({**stack, "LLM_BATCH_API_SCOPE": "everyone"})
    with pytest.raises(lambda_front.FrontConfigError, match="LLM_BATCH_METRICS_NAMESPACE"):
        lambda_front.build_handler({k: v for k, v in stack.items() if k != "LLM_BATCH_METRICS_NAMESPACE"})
    # The bound a stopped run's partial files are waited for is the stack's (infra/components/batch_api.py: on EKS
    # the GPU sweep and the pods' grace, issue 59 finding 6); a front without it keeps the executor's own.
    from workload.batch_api.sfn_executor import STOP_WAIT_S

    for bad in ("0", "-5", "soon", "nan"):
        with pytest.raises(lambda_front.FrontConfigError, match=f"LLM_BATCH_STOP_WAIT_S .*got '{bad}'"):
            lambda_front.build_service({**stack, "LLM_BATCH_STOP_WAIT_S": bad})
    service = lambda_front.build_service({**stack, "LLM_BATCH_STOP_WAIT_S": "2235"})
    assert service.executor.stop_wait_s == 2235  # type: ignore[attr-defined]
    unset = {k: v for k, v in stack.items() if k != "LLM_BATCH_STOP_WAIT_S"}
    assert lambda_front.build_service(unset).executor.stop_wait_s == STOP_WAIT_S  # type: ignore[attr-defined]
    # The largest `vision` upload is the stack's job setting; a front deployed before the stack set it serves none.
    for bad in ("0", "8MiB"):
        with pytest.raises(lambda_front.FrontConfigError, match=f"LLM_BATCH_MAX_IMAGE_BYTES .*got '{bad}'"):
            lambda_front.build_service({**stack, "LLM_BATCH_MAX_IMAGE_BYTES": bad})
    assert lambda_front.build_service({**stack, "LLM_BATCH_MAX_IMAGE_BYTES": "4096"}).limits.max_image_bytes == 4096
    assert lambda_front.build_service(stack).limits.max_image_bytes is None


def test_the_tick_entry_starts_a_named_batch_ahead_of_the_queue(
    stack: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`{"start_batch": ID}` is what `python -m infra.run STACK --batch ID` sends the deployed function."""
    for name, value in stack.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(lambda_front, "_built", {})
    service = lambda_front.build_service(stack)
    file_id = service.upload_file("project", "in.jsonl", "batch", [_line("a").encode()])["id"]
    first, second = (service.create_batch("project", file_id, "/v1/chat/completions", "24h")["id"] for _ in "ab")
    assert lambda_front.tick({"start_batch": second}, {}) == {"status": "running"}
    assert service.get_batch("project", second)["status"] == "in_progress"
    assert service.get_batch("project", first)["status"] == "validating"  # the older one waits behind it
    assert lambda_front.tick({"start_batch": first}, {}) == {
        "error": f"batch {second} is running; {first} starts after it (one job on the GPUs)"
    }
    assert lambda_front.tick({"start_batch": second}, {}) == {
        "error": f"batch {second} is in_progress, not queued: only a queued batch starts"
    }
    assert "No such Batch object" in lambda_front.tick({"start_batch": "batch_nope"}, {})["error"]


def test_both_functions_print_the_queues_metrics_as_emf_lines(
    stack: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The HTTP function's line after a request that made a batch failed; the tick's after each tick."""
    for name, value in stack.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(lambda_front, "_built", {})
    front = Front(lambda_front.build_handler(stack))
    status, _, raw = front.call("POST", "/v1/files", files={"file": ("empty.jsonl", b"\n")}, data={"purpose": "batch"})
    assert status == 200 and capsys.readouterr().out == ""  # an upload closes no batch: no line
    request = {"input_file_id": json.loads(raw)["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    status, _, raw = front.call("POST", "/v1/batches", json=request)
    assert json.loads(raw)["status"] == "failed"
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["BatchApiFailed"] == 1
    assert lambda_front.tick({}, {}) == {"status": "ticked"}
    (line,) = capsys.readouterr().out.splitlines()
    document = json.loads(line)
    assert document["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "LLMBatch" and document["Stack"] == "small"
    counts = {name: document[name] for name in ("BatchApiQueued", "BatchApiRunning", "BatchApiFailed")}
    assert counts == {"BatchApiQueued": 0, "BatchApiRunning": 0, "BatchApiFailed": 0}  # the request counted it
