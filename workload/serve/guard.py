"""What stands in front of the endpoint's app on both request paths: API key, routes, body cap, CORS.

The same pure-ASGI stack wraps vLLM's own server inside the engine replica (direct streaming, workload/serve/direct.py)
and Serve LLM's FastAPI ingress (workload/serve/ingress.py), outermost, in this order:
- `RequireApiKey` (workload/auth): 401 with OpenAI's body without a known key. Health checks never reach it: Serve's
  proxy and each replica's HTTP server answer `/-/healthz` and `/-/routes` before the app (ray/serve/_private/
  replica.py, proxy.py), which is what KubeRay's probes and HAProxy's backend checks call.
- `RoutesOnly`: only the OpenAI routes docs/serve.md lists; the rest (`/docs`, `/openapi.json`, `/tokenize`,
  `/metrics`, `/invocations`, `/scale_elastic_ep`, ...) is 404, so a key holder cannot reach an operator's route.
- `BodyCap`: a body above the cap is 413 before the app reads a byte of it (a declared length) or as soon as the
  stream passes it (chunked), so no request makes a replica buffer more than the cap.
CORS, when configured, goes outside the key check: a browser's preflight carries no key.

`GuardSettings` is what travels to the replica (plain data, no key text: a key file's path or a secret's id); the
replica builds its `ApiKeys` from it when its app is built, so a source it cannot read fails the replica's start.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workload.auth.asgi import RequireApiKey
from workload.auth.keys import ENV_KEY, ApiKeys, KeyConfigError, KeySource, keys_for_host
from workload.contract.serve_config import ServeConfig

# The routes docs/serve.md lists, and nothing else (the model listing, one model, the two generation routes).
OPENAI_ROUTES = {
    "/v1/models": ("GET",),
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
}
_ONE_MODEL = re.compile(r"/v1/models/[^/]+")
KEY_FILE_NAME = "api-keys"
EXPERIMENTAL_CONFIG_KEY = "llm_batch_guard"


@dataclass(frozen=True)
class GuardSettings:
    """The guard's settings as they travel to a replica: where the keys are (never the keys), the cap, CORS."""

    max_body_bytes: int
    key_file: str | None = None
    secret_id: str | None = None
    region: str | None = None
    cors_origins: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cors_origins": list(self.cors_origins)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardSettings:
        return cls(**{**data, "cors_origins": tuple(data.get("cors_origins", ()))})

    def keys(self) -> ApiKeys | None:
        """The replica's keys; None only where the endpoint was allowed to start without any (loopback)."""
        if not (self.key_file or self.secret_id):
            return None
        key_file = Path(self.key_file) if self.key_file else None
        return ApiKeys(KeySource(key_file=key_file, secret_id=self.secret_id, region=self.region))


def guard_settings(
    config: ServeConfig,
    env: Mapping[str, str],
    key_folder: str | None,
    read_now: bool = True,
) -> GuardSettings:
    """The endpoint's guard from its config and environment; raises KeyConfigError in one line when it may not start.

    `read_now`: read the keys once here, so a source that cannot be read stops the start (not where the source is
    only reachable from the replicas, as a cluster's app builder). `key_folder`: where a key given as
    `LLM_BATCH_API_KEY` is written; None where the replicas cannot read this machine's files (a cluster).

    A key given as `LLM_BATCH_API_KEY` is written to `key_folder` (owner-only) and travels by that file's path: the
    key's text goes into no Ray runtime environment, no GCS record and no worker's environment.
    """
    settings = config.serve
    source = KeySource.from_env(env, key_file=settings.api_key_file, secret_id=settings.api_key_secret)
    if read_now or not source.configured:
        keys_for_host(settings.host, source, f"the endpoint on port {settings.port}")  # reads a configured source
    key_file = str(source.key_file.resolve()) if source.key_file else None  # the replicas run in other folders
    if source.key:
        if key_folder is None:
            raise KeyConfigError(
                f"{ENV_KEY} cannot reach this endpoint's replicas (they may run on other nodes): give the keys as "
                "a Secrets Manager secret (serve.api_key_secret)"
            )
        path = os.path.join(key_folder, KEY_FILE_NAME)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(source.key.strip() + "\n")
        key_file = path
    return GuardSettings(
        max_body_bytes=config.max_body_bytes,
        key_file=key_file,
        secret_id=source.secret_id,
        region=source.region,
        cors_origins=settings.cors_origins,
    )


def _error(status: int, message: str, kind: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


async def _respond(send: Send, status: int, message: str, kind: str) -> None:
    headers, body = _error(status, message, kind)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def is_served_route(path: str) -> bool:
    return path in OPENAI_ROUTES or _ONE_MODEL.fullmatch(path) is not None


class RoutesOnly:
    """404 in OpenAI's error shape for any path but the OpenAI routes this endpoint serves."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # none of the served routes is one
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http" and not is_served_route(scope["path"]):
            message = (
                f"Not found: {scope['path']} (this endpoint serves /v1/models, /v1/chat/completions and "
                "/v1/completions)."
            )
            await _respond(send, 404, message, "NotFoundError")
            return
        await self.app(scope, receive, send)


class BodyCap:
    """413 for a body over `limit` bytes: by its declared length before reading, or once the stream passes it.

    The body is read up to the cap and replayed to the app; after it, `receive` is the server's own again, so a
    client that hangs up mid-stream still reaches the app as `http.disconnect`.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, replay([message], receive), send)  # a disconnect before the body ended
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, replay([whole], receive), send)

    async def _refuse(self, send: Send) -> None:
        message = f"The request body is larger than this endpoint's limit of {self.limit} bytes (serve.max_body_bytes)."
        await _respond(send, 413, message, "RequestTooLargeError")


def replay(messages: list[Message], receive: Receive) -> Receive:
    """`receive` that first hands out `messages` (a body already read), then the server's own messages."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


class EndpointGuard:
    """The whole guard as one ASGI middleware (Starlette's `add_middleware(EndpointGuard, settings=...)`)."""

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        inner: ASGIApp = RoutesOnly(BodyCap(app, settings.max_body_bytes))
        keys = settings.keys()
        if keys is not None:
            inner = RequireApiKey(inner, keys)
        if settings.cors_origins:
            inner = CORSMiddleware(
                inner,
                allow_origins=list(settings.cors_origins),
                allow_credentials=False,
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type"],
            )
        self.app = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def install(app: Any, settings: GuardSettings) -> None:
    """The guard outermost in a Starlette/FastAPI app, in place of the app's own CORS middleware (Serve LLM's
    allows every origin with credentials, vLLM's every origin): CORS is only what serve.cors_origins says."""
    app.user_middleware = [entry for entry in app.user_middleware if entry.cls is not CORSMiddleware]
    app.middleware_stack = None  # rebuilt on the next call, with the guard (vLLM builds its stack eagerly)
    app.add_middleware(EndpointGuard, settings=settings)
