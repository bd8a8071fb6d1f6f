"""The endpoint's guard (workload/serve/guard.py) and its start checks, without an engine.

The guard wraps a real Starlette app under Starlette's TestClient (a real ASGI server loop over httpx, in-process);
the request paths it wraps in a running endpoint are tested in tests/workload/test_serve_endpoint.py (direct
streaming) and tests/workload/test_serve_ingress.py (Serve's ingress)."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from workload.auth.keys import KeyConfigError
from workload.contract.config import ConfigError
from workload.contract.serve_config import BODY_OVERHEAD_BYTES, build_serve_config
from workload.serve.endpoint import PortBusyError, check_ports_free
from workload.serve.guard import GuardSettings, guard_settings, install

KEY = "sk-test-0123456789"


async def _echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"path": request.url.path, "bytes": len(body)})


def _app(settings: GuardSettings) -> Starlette:
    routes = [
        Route(path, _echo, methods=["GET", "POST"])
        for path in ("/v1/models", "/v1/models/{name}", "/v1/completions", "/v1/chat/completions", "/docs", "/tokenize")
    ]
    app = Starlette(routes=routes)
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True)  # as Serve LLM's init() does
    install(app, settings)
    return app


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2026-12\n{KEY}\nsk-the-next-key\n")
    return str(path)


@pytest.fixture
def client(key_file: str) -> Iterator[TestClient]:
    with TestClient(_app(GuardSettings(max_body_bytes=4096, key_file=key_file))) as test_client:
        yield test_client


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_a_known_key_passes_and_a_missing_or_wrong_one_is_openais_401(client: TestClient) -> None:
    assert client.get("/v1/models", headers=AUTH).json() == {"path": "/v1/models", "bytes": 0}
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-the-next-key"}).status_code == 200
    missing = client.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "invalid_request_error"
    wrong = client.post("/v1/completions", headers={"Authorization": "Bearer sk-nope"}, json={})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/docs", "/tokenize", "/openapi.json", "/metrics", "/v1/models/a/b"])
def test_only_the_openai_routes_answer(client: TestClient, path: str) -> None:
    response = client.get(path, headers=AUTH)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["type"] == "NotFoundError"
    assert client.get(path).status_code == 401  # without a key, nothing is told about routes


def test_one_model_and_the_generation_routes_are_served(client: TestClient) -> None:
    assert client.get("/v1/models/tiny", headers=AUTH).status_code == 200
    assert client.post("/v1/chat/completions", headers=AUTH, json={"m": 1}).json()["bytes"] == len('{"m":1}')


def test_a_body_over_the_cap_is_413_by_its_length_or_as_it_streams(client: TestClient) -> None:
    declared = client.post("/v1/completions", headers=AUTH, content=b"x" * 4097)
    assert declared.status_code == 413 and "4096 bytes" in declared.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked, as a client streaming a body sends it
        for _ in range(8):
            yield b"y" * 1000

    streamed = client.post("/v1/completions", headers=AUTH, content=chunks())
    assert streamed.status_code == 413
    fits = client.post("/v1/completions", headers=AUTH, content=b"z" * 4096)
    assert fits.status_code == 200 and fits.json()["bytes"] == 4096


def test_cors_is_off_unless_configured_and_a_preflight_needs_no_key(key_file: str) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with TestClient(_app(GuardSettings(max_body_bytes=4096, key_file=key_file))) as plain:
        answer = plain.get("/v1/models", headers={**AUTH, "Origin": "https://app.example"})
        assert "access-control-allow-origin" not in answer.headers  # the app's own allow-all CORS is gone
        assert plain.options("/v1/models", headers=preflight).status_code == 401
    allowed = GuardSettings(max_body_bytes=4096, key_file=key_file, cors_origins=("https://app.example",))
    with TestClient(_app(allowed)) as browser:
        answer = browser.options("/v1/models", headers=preflight)
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "https://app.example"
        assert "access-control-allow-credentials" not in answer.headers


def test_no_key_is_allowed_only_on_loopback(tmp_path: Path) -> None:
    loopback = build_serve_config({})
    settings = guard_settings(loopback, {}, str(tmp_path))
    assert settings.keys() is None
    with TestClient(_app(settings)) as open_client:
        assert open_client.get("/v1/models").status_code == 200
        assert open_client.get("/docs").status_code == 404
    everywhere = build_serve_config({"serve": {"host": "0.0.0.0"}})
    with pytest.raises(KeyConfigError) as error:
        guard_settings(everywhere, {}, str(tmp_path))
    assert "0.0.0.0" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(KeyConfigError):  # the cluster's builder reads no key, but still needs a source
        guard_settings(everywhere, {}, str(tmp_path), read_now=False)


def test_an_environment_key_travels_as_an_owner_only_file(tmp_path: Path) -> None:
    config = build_serve_config({"serve": {"host": "0.0.0.0"}})
    settings = guard_settings(config, {"LLM_BATCH_API_KEY": KEY}, str(tmp_path))
    assert KEY not in repr(settings.to_dict())
    assert settings.key_file is not None and Path(settings.key_file).read_text().strip() == KEY
    assert stat.S_IMODE(os.stat(settings.key_file).st_mode) == 0o600
    assert GuardSettings.from_dict(settings.to_dict()) == settings
    keys = settings.keys()
    assert keys is not None and keys.match(KEY) is not None


def test_a_configured_key_file_or_secret_is_named_not_read_by_the_cluster_builder(tmp_path: Path) -> None:
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:llm-batch-keys-AbCdEf"
    config = build_serve_config({"serve": {"host": "0.0.0.0", "api_key_secret": arn}})
    settings = guard_settings(config, {"AWS_REGION": "eu-west-1"}, str(tmp_path), read_now=False)
    assert (settings.secret_id, settings.region, settings.key_file) == (arn, "eu-west-1", None)
    missing = build_serve_config({"serve": {"host": "0.0.0.0", "api_key_file": str(tmp_path / "none")}})
    with pytest.raises(KeyConfigError, match="cannot read the key file"):
        guard_settings(missing, {}, str(tmp_path))


def test_the_body_cap_fits_a_prompt_as_long_as_the_context() -> None:
    config = build_serve_config({"engine": {"max_model_len": 32768}})
    assert config.max_body_bytes == 32768 * 64 + BODY_OVERHEAD_BYTES
    assert build_serve_config({"serve": {"max_body_bytes": 5000}}).max_body_bytes == 5000


@pytest.mark.parametrize("switch", ["enable_log_requests", "enable_log_outputs", "disable_log_requests"])
def test_engine_extra_cannot_turn_on_prompt_logging(switch: str) -> None:
    with pytest.raises(ConfigError, match=f"engine.extra.{switch}: the endpoint never logs prompts"):
        build_serve_config({"engine": {"extra": {switch: switch != "disable_log_requests"}}})


def test_a_busy_port_stops_the_start_naming_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortBusyError, match=f"port {port} on 127.0.0.1 is in use"):
            check_ports_free("127.0.0.1", {port: "the endpoint's port"})
    check_ports_free("127.0.0.1", {port: "the endpoint's port"})  # free again once nothing listens


def test_serve_llms_ingress_app_answers_only_its_openai_routes(key_file: str) -> None:
    """The ingress path's real app (Serve LLM's FastAPI app with the ingress's own routes, workload/serve/ingress.py),
    without a Serve deployment behind it: the routes it has beyond the OpenAI four are 404, its allow-all CORS is
    gone. The same app in a running endpoint: tests/workload/test_serve_ingress.py."""
    from ray.llm._internal.serve.core.ingress.ingress import make_fastapi_ingress

    from workload.serve.ingress import CpuIngress, fastapi_app

    app = fastapi_app(GuardSettings(max_body_bytes=4096, key_file=key_file))
    make_fastapi_ingress(CpuIngress, app=app)
    extra = {"/docs", "/openapi.json", "/redoc", "/tokenize", "/detokenize", "/v1/embeddings", "/v1/score"}
    assert extra <= {getattr(route, "path", "") for route in app.routes}  # they are there, behind the guard
    client = TestClient(app)
    for path in sorted(extra):
        assert client.post(path, headers=AUTH, json={}).status_code == 404, path
        assert client.post(path, json={}).status_code == 401, path
    assert client.post("/v1/completions", headers=AUTH, content=b"x" * 5000).status_code == 413
    answer = client.get("/docs", headers={**AUTH, "Origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in answer.headers


def test_cors_origins_are_origins() -> None:
    assert build_serve_config({"serve": {"cors_origins": ["https://app.example:8443"]}}).serve.cors_origins == (
        "https://app.example:8443",
    )
    with pytest.raises(ConfigError, match=r"serve\.cors_origins: .*'https://app\.example/path' is not an origin"):
        build_serve_config({"serve": {"cors_origins": ["https://app.example/path"]}})


def test_the_cluster_builder_refuses_an_endpoint_without_a_key_source() -> None:
    """The RayService's application builder (workload/serve/cluster.py) stops before building anything: Serve
    reports the line as the application's status."""
    from workload.serve.cluster import app

    with pytest.raises(KeyConfigError, match=r"binds 0\.0\.0\.0, reachable from other machines, and has no API key"):
        app({"config": {"device": "gpu", "serve": {"host": "0.0.0.0", "haproxy": False}}})
