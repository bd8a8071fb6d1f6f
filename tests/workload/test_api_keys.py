"""The API-key mechanism shared by the endpoint and the Batch API (workload/auth): sources, rotation, the 401.

The middleware runs under Starlette's TestClient (a real ASGI app over httpx, in-process); Secrets Manager is the
session's moto server (a real HTTP API, standing in for AWS's)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from workload.auth.asgi import RequireApiKey
from workload.auth.keys import (
    ApiKeys,
    KeyConfigError,
    KeySource,
    bearer_key,
    is_loopback_host,
    key_id,
    keys_for_host,
    parse_key_text,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_file_holds_several_keys_with_comments_and_blanks() -> None:
    assert parse_key_text("# rotated 2026-12-01\nold-key\n\n  new-key  \n") == ("old-key", "new-key")
    assert parse_key_text('{"keys": ["a", " b ", ""]}') == ("a", "b")


@pytest.mark.parametrize("text", ['{"keys": "one"}', '{"key": ["a"]}', "{not json"])
def test_a_malformed_json_secret_is_refused_by_name(text: str) -> None:
    with pytest.raises(KeyConfigError, match="JSON"):
        parse_key_text(text)


def test_one_source_only_and_none_named_in_errors() -> None:
    env = {"LLM_BATCH_API_KEY": "k", "LLM_BATCH_API_KEY_FILE": "/x"}
    with pytest.raises(KeyConfigError, match="one source"):
        KeySource.from_env(env)
    assert KeySource.from_env({"LLM_BATCH_API_KEY": "secret-text"}).describe() == "LLM_BATCH_API_KEY"


def test_an_empty_or_missing_key_file_stops_the_start(tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("# no keys yet\n")
    with pytest.raises(KeyConfigError, match="holds no key"):
        ApiKeys(KeySource(key_file=empty))
    with pytest.raises(KeyConfigError, match="cannot read the key file"):
        ApiKeys(KeySource(key_file=tmp_path / "absent"))


def test_a_rotation_in_the_key_file_takes_effect_after_the_refresh(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("old\n")
    clock = Clock()
    keys = ApiKeys(KeySource(key_file=path), refresh_s=30, clock=clock)
    path.write_text("old\nnew\n")
    assert keys.match("new") is None  # not re-read yet
    clock.now = 31
    assert keys.match("new") == key_id("new") and keys.match("old") == key_id("old")
    path.write_text("new\n")
    clock.now = 62
    assert keys.match("old") is None and keys.match("new") == key_id("new")


def test_a_failed_reread_keeps_the_last_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys"
    path.write_text("only\n")
    clock = Clock()
    keys = ApiKeys(KeySource(key_file=path), refresh_s=1, clock=clock)
    path.unlink()
    clock.now = 5
    assert keys.match("only") == key_id("only")
    assert "keeping the last API keys" in capsys.readouterr().err


def test_keys_from_a_secrets_manager_secret(moto_endpoint: str) -> None:
    client = boto3.client("secretsmanager", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_secret(Name="llm-batch/test-keys", SecretString=json.dumps({"keys": ["k1", "k2"]}))
    keys = ApiKeys(KeySource(secret_id="llm-batch/test-keys"), secrets_client=client)
    assert keys.match("k2") == key_id("k2") and keys.match("k3") is None and len(keys) == 2
    with pytest.raises(KeyConfigError, match="cannot read the Secrets Manager secret llm-batch/absent"):
        ApiKeys(KeySource(secret_id="llm-batch/absent"), secrets_client=client)


def test_no_key_only_on_loopback() -> None:
    assert keys_for_host("127.0.0.1", KeySource(), "the endpoint") is None
    assert keys_for_host("::1", KeySource(), "the endpoint") is None
    for host in ("0.0.0.0", "10.0.3.7", "my-host"):
        with pytest.raises(KeyConfigError, match=f"binds {host}, reachable from other machines, and has no API key"):
            keys_for_host(host, KeySource(), "the endpoint")
    assert is_loopback_host("localhost") and is_loopback_host("127.8.0.1") and not is_loopback_host("::")


def test_bearer_parsing() -> None:
    assert bearer_key("Bearer abc") == "abc" and bearer_key("bearer  abc ") == "abc"
    assert bearer_key("Basic abc") is None and bearer_key("Bearer ") is None and bearer_key(None) is None


def _guarded_app(keys: ApiKeys) -> TestClient:
    async def who(request: Request) -> JSONResponse:
        return JSONResponse({"key": request.scope["state"].get("api_key_id")})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/v1/models", who), Route("/-/healthz", health)])
    return TestClient(RequireApiKey(app, keys, open_paths=frozenset({"/-/healthz"})))


def test_the_middleware_answers_openai_401s_and_passes_known_keys() -> None:
    client = _guarded_app(ApiKeys(KeySource(key="right")))
    missing = client.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "invalid_request_error"
    assert "didn't provide an API key" in missing.json()["error"]["message"]
    wrong = client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert "wrong" not in wrong.text  # the presented key is not echoed back
    assert client.get("/v1/models", headers={"Authorization": "Bearer right"}).json() == {"key": key_id("right")}
    assert client.get("/-/healthz").status_code == 200


def test_the_official_client_sees_an_authentication_error() -> None:
    openai = pytest.importorskip("openai")
    client = _guarded_app(ApiKeys(KeySource(key="right")))
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", http_client=client, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        sdk.models.list()
    assert raised.value.code == "invalid_api_key"
