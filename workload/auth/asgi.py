"""ASGI middleware that lets a request through only with a known API key; OpenAI's 401 body otherwise.

Pure ASGI (no framework), so the same class guards vLLM's own server (direct streaming), Serve's FastAPI ingress and
the Batch API's app. Paths in `open_paths` (a health probe a load balancer or KubeRay calls without a key) pass.
The matched key's `key_id` goes into `scope["state"]["api_key_id"]`, and its name and admin flag (entries.py) into
`api_key_name` and `api_key_admin`, for apps that scope data per key.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from workload.auth.keys import ApiKeys, bearer_key, key_id, openai_auth_error


class RequireApiKey:
    def __init__(self, app: ASGIApp, keys: ApiKeys, open_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        presented = bearer_key(headers.get("authorization"))
        matched = self.keys.identify(presented)
        if matched is None:
            await _unauthorized(scope, send, presented)
            return
        state = scope.setdefault("state", {})
        state["api_key_id"], state["api_key_name"], state["api_key_admin"] = (
            key_id(matched.key),
            matched.name,
            matched.admin,
        )
        await self.app(scope, receive, send)


async def _unauthorized(scope: Scope, send: Send, presented: str | None) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(openai_auth_error(presented)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="llm-batch"'),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
