"""The Batch API's HTTP routes (OpenAI's Files, Uploads, Batches, Models), as one ASGI app over a `BatchService`.

Starlette alone (no FastAPI): every body in and out is OpenAI's, including its error bodies, which FastAPI's own
validation errors (422, `detail`) are not. Imports neither Ray nor vLLM (tests/workload/test_batch_api.py checks),
so the AWS front can serve this module as it is. Every route calls the service and nothing else (as vLLM's
OpenAI server's routes call only their serving classes). The service is synchronous (a store may be S3): each
call runs in Starlette's thread pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from workload.auth.asgi import RequireApiKey
from workload.auth.keys import ApiKeys
from workload.batch_api.body_cap import capped
from workload.batch_api.idempotency import HEADER as IDEMPOTENCY_HEADER
from workload.batch_api.objects import ApiError
from workload.batch_api.service import BatchService
from workload.batch_api.tenants import DEFAULT_SCOPE, NO_KEY_OWNER, PROJECT_OWNER, Scope, Tenant
from workload.batch_api.uploads import MAX_PART_BYTES

HEALTH = "/health"
MULTIPART_SLACK = 64 * 1024  # a multipart body's boundaries and fields, beyond the file itself


def _owner(request: Request, scope: Scope) -> Tenant:
    """The tenant a request acts for (tenants.py), from what workload/auth/asgi.py put in its state."""
    if scope == "project":
        return Tenant(PROJECT_OWNER)
    state = request.scope.get("state", {})
    name = state.get("api_key_name")
    if not name:
        return Tenant(NO_KEY_OWNER)
    return Tenant(f"key-{name}", bool(state.get("api_key_admin")))


def _int(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, got {value!r}", name) from None


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def build_app(service: BatchService, keys: ApiKeys | None, scope: Scope = DEFAULT_SCOPE) -> ASGIApp:
    """The ASGI app; with `keys` every route but /health needs one of them (workload/auth)."""

    async def call(function: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(function, *args)

    async def upload(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > service.limits.max_file_bytes + MULTIPART_SLACK:
            limit = service.limits.max_file_bytes
            raise ApiError(413, f"the file is larger than this server's limit of {limit} bytes", "file")
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError(400, "upload a file as multipart/form-data with fields 'file' and 'purpose'")
        cap = service.limits.max_file_bytes + MULTIPART_SLACK
        form = await capped(request, cap, "a file", "file").form(max_files=1, max_fields=8)
        try:
            file, purpose = form.get("file"), form.get("purpose")
            if not isinstance(file, UploadFile):
                raise ApiError(400, "the 'file' field is missing or is not a file", "file")
            if not isinstance(purpose, str) or not purpose:
                raise ApiError(400, "the 'purpose' field is required", "purpose")
            seconds = form.get("expires_after[seconds]") or form.get("expires_after.seconds")
            anchor = form.get("expires_after[anchor]") or form.get("expires_after.anchor")
            if anchor not in (None, "created_at"):
                raise ApiError(400, "expires_after.anchor must be 'created_at'", "expires_after.anchor")
            if seconds is not None and (not isinstance(seconds, str) or not seconds.isdigit()):
                raise ApiError(400, "expires_after.seconds must be an integer", "expires_after.seconds")

            def chunks() -> Iterator[bytes]:
                while chunk := file.file.read(1 << 20):
                    yield chunk

            owner = _owner(request, scope)
            created = await call(
                service.upload_file, owner, file.filename or "upload.jsonl", purpose, chunks(), seconds and int(seconds)
            )
        finally:
            await form.close()
        return JSONResponse(created)

    async def list_files(request: Request) -> Response:
        query = request.query_params
        page = await call(
            service.list_files,
            _owner(request, scope),
            query.get("after"),
            _int(request, "limit", 10_000),
            query.get("order", "desc"),
            query.get("purpose"),
        )
        return JSONResponse(page)

    async def get_file(request: Request) -> Response:
        return JSONResponse(await call(service.get_file, _owner(request, scope), request.path_params["file_id"]))

    async def delete_file(request: Request) -> Response:
        return JSONResponse(await call(service.delete_file, _owner(request, scope), request.path_params["file_id"]))

    async def file_content(request: Request) -> Response:
        owner, file_id = _owner(request, scope), request.path_params["file_id"]
        elsewhere = await call(service.file_redirect, owner, file_id)
        if elsewhere is not None:  # larger than the front answers: the client follows to the store (307 keeps GET)
            return RedirectResponse(elsewhere, status_code=307)
        body = await call(service.file_content, owner, file_id)
        return StreamingResponse(body, media_type="application/octet-stream")

    async def create_upload(request: Request) -> Response:
        return JSONResponse(await call(service.create_upload, _owner(request, scope), await _json_body(request)))

    async def add_part(request: Request) -> Response:
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError(400, "send a part as multipart/form-data with the field 'data'")
        form = await capped(request, MAX_PART_BYTES + MULTIPART_SLACK, "a part", "data").form(max_files=1, max_fields=4)
        try:
            data = form.get("data")
            if not isinstance(data, UploadFile):
                raise ApiError(400, "the 'data' field is missing or is not a file", "data")

            def chunks() -> Iterator[bytes]:
                while chunk := data.file.read(1 << 20):
                    yield chunk

            owner, upload_id = _owner(request, scope), request.path_params["upload_id"]
            part = await call(service.add_upload_part, owner, upload_id, chunks())
        finally:
            await form.close()
        return JSONResponse(part)

    async def complete_upload(request: Request) -> Response:
        body = await _json_body(request)
        owner, upload_id = _owner(request, scope), request.path_params["upload_id"]
        done = await call(service.complete_upload, owner, upload_id, body.get("part_ids"), body.get("md5"))
        return JSONResponse(done)

    async def cancel_upload(request: Request) -> Response:
        owner, upload_id = _owner(request, scope), request.path_params["upload_id"]
        return JSONResponse(await call(service.cancel_upload, owner, upload_id))

    async def create_batch(request: Request) -> Response:
        body = await _json_body(request)
        known = {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ApiError(400, f"unknown parameter {unknown[0]!r}", unknown[0])
        created = await call(
            service.create_batch,
            _owner(request, scope),
            body.get("input_file_id"),
            body.get("endpoint"),
            body.get("completion_window"),
            body.get("metadata"),
            request.headers.get(IDEMPOTENCY_HEADER),
        )
        return JSONResponse(created)

    async def get_batch(request: Request) -> Response:
        return JSONResponse(await call(service.get_batch, _owner(request, scope), request.path_params["batch_id"]))

    async def list_batches(request: Request) -> Response:
        owner = _owner(request, scope)
        page = await call(service.list_batches, owner, request.query_params.get("after"), _int(request, "limit", 20))
        return JSONResponse(page)

    async def cancel_batch(request: Request) -> Response:
        return JSONResponse(await call(service.cancel_batch, _owner(request, scope), request.path_params["batch_id"]))

    async def list_models(request: Request) -> Response:
        return JSONResponse(service.list_models())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def api_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, ApiError)
        return JSONResponse(error.body(), status_code=error.status)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        wording = {404: f"Unknown request URL: {request.method} {request.url.path}", 405: "Method not allowed"}
        message = wording.get(error.status_code, str(error.detail))
        return JSONResponse(ApiError(error.status_code, message).body(), status_code=error.status_code)

    routes = [
        Route(HEALTH, health, methods=["GET"]),
        Route("/v1/files", upload, methods=["POST"]),
        Route("/v1/files", list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", get_file, methods=["GET"]),
        Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
        Route("/v1/uploads", create_upload, methods=["POST"]),
        Route("/v1/uploads/{upload_id}/parts", add_part, methods=["POST"]),
        Route("/v1/uploads/{upload_id}/complete", complete_upload, methods=["POST"]),
        Route("/v1/uploads/{upload_id}/cancel", cancel_upload, methods=["POST"]),
        Route("/v1/batches", create_batch, methods=["POST"]),
        Route("/v1/batches", list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error})
    if keys is None:
        return app
    return RequireApiKey(app, keys, open_paths=frozenset({HEALTH}))
