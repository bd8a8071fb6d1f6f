"""Ray Serve LLM's OpenAI ingress, with two of its error answers mended so every bad request gets an OpenAI 4xx.

- An unknown model: the stock ingress raises FastAPI's HTTPException, answered as `{"detail": ...}`; OpenAI clients
  look for `{"error": {...}}`. Raised as Serve LLM's own OpenAIHTTPException, it takes the path of every other error.
- A body that is not JSON-typed (no or another Content-Type): FastAPI reports the raw bytes as the bad input, and the
  stock handler puts them in the response, which cannot be encoded: a 500. This handler answers 400 and names it.

The FastAPI app is Serve LLM's own (`init()`: its middleware, CORS, request ids), with this handler registered on it;
the app graph is what `build_openai_app` builds (ray 2.60, core/ingress/builder.py), with this ingress class.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException, to_model_metadata
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, init, make_fastapi_ingress
from ray.llm._internal.serve.core.server.builder import build_llm_deployment


class Ingress(OpenAiIngress):
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


def fastapi_app() -> FastAPI:
    app = init()
    app.add_exception_handler(RequestValidationError, validation_error)
    return app


def build_openai_app(llm_config: Any, ingress_options: dict[str, Any]) -> Any:
    """One model behind the mended ingress; `ingress_options` are merged over the ingress's defaults."""
    model_id = llm_config.model_id
    ingress_cls = make_fastapi_ingress(Ingress, app=fastapi_app())
    options = maybe_apply_llm_deployment_config_defaults(Ingress.get_deployment_options([llm_config]), ingress_options)
    return serve.deployment(ingress_cls, **options).bind(
        llm_deployments={model_id: build_llm_deployment(llm_config)},
        model_cards={model_id: to_model_metadata(model_id, llm_config)},
        lora_paths={},
    )
