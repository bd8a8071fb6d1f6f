"""The Batch API on the AWS tiers: one Lambda function behind an API Gateway HTTP API (payload format 2.0).

`handler` serves the routes: Mangum (a maintained ASGI adapter for API Gateway and ALB events) turns each event
into an ASGI request to the same app the local server runs (app.py), over `S3Store` (the stack's bucket) and
`StepFunctionsExecutor` (the stack's state machine). `tick` is the scheduled half (an EventBridge schedule every
minute): it moves batches on, as the local server's ticker does every second.

Everything is read from the environment at the first invocation (a bad setting fails that cold start, in one
line, before any request is served):
    LLM_BATCH_BUCKET, LLM_BATCH_API_PREFIX (default batch-api/), LLM_BATCH_KMS_KEY_ID (the stack key),
    LLM_BATCH_STATE_MACHINE_ARN, LLM_BATCH_GPU_GROUP (the small tier's GPU group; unset on the EKS tiers),
    LLM_BATCH_RELEASE_FUNCTION (the EKS tiers' nightly submit function, whose `release` a stop invokes),
    LLM_BATCH_TICK_FUNCTION (the HTTP function's only: the tick function its cancel asks to stop the run),
    LLM_BATCH_MODEL (the name batches report), LLM_BATCH_SERVED_MODELS (the names GET /v1/models lists, comma
    separated: the model, its aliases and LoRA adapters; unset: LLM_BATCH_MODEL alone),
    LLM_BATCH_API_SCOPE (key, the default, or project),
    LLM_BATCH_API_KEY_SECRET (the Batch API's own key secret, workload/auth/keys.py; keys of at least 32
    characters): no key source, no start;
    LLM_BATCH_STACK and LLM_BATCH_METRICS_NAMESPACE (where the queue's metrics go, queue_metrics.py);
    LLM_BATCH_STOP_WAIT_S (seconds a cancelled or expired batch's stopped run is waited for, for its partial files:
    the stack's job grace on the small tier, the GPU sweep and the pods' grace on EKS; infra/components/batch_api.py);
    LLM_BATCH_QUOTA_<NAME> (each key's quotas and request bounds, quotas.py; unset: its default);
    LLM_BATCH_POOL_BATCHES (queued batches of one endpoint that share one run, pools.py; unset: 1, each alone);
    LLM_BATCH_MAX_IMAGE_BYTES (the HTTP function's: the largest `vision` upload, the job's input.max_image_bytes,
    vision.py; unset: a front deployed before the stack set it, which serves no vision files);
    LLM_BATCH_EVENT_BUS (the stack's default event bus, whose ARN the stack sets: every batch state change is an
    event there) and LLM_BATCH_WEBHOOKS_SECRET (the keys' webhooks, webhooks.py); unset: none (events.py). Both
    functions record the events with the changes; only the tick sends them (event_delivery.py), so only its role
    may put events and read the webhooks' secret.

Both functions print the queue's metrics as Embedded Metric Format lines to their log (queue_metrics.py): the
tick after each tick, the HTTP function after a request that closed a batch failed.

Size limits (API Gateway HTTP API: 10 MB a request; Lambda: 6 MB a synchronous request or response, and a binary
body travels base64, 4/3 of its size): a body of at most `FRONT_BODY_BYTES` goes through in one request, so a
file larger than that is uploaded through OpenAI's Uploads API in parts of at most that size
(`client.uploads.upload_file_chunked(..., part_size=4 * 1024 * 1024)`), and a download larger than it is a 307 to
a presigned S3 URL, which the official client follows (its httpx client has `follow_redirects=True`). An image
over that size (the job's bound is 8 MiB by default) comes the same way, in parts: the front checks the completed
file whole, as it checks one sent in one request (uploads.py `complete`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from workload.auth.keys import ApiKeys, KeySource
from workload.batch_api.app import build_app
from workload.batch_api.event_delivery import EventBridgeBus, EventConfig
from workload.batch_api.objects import ApiError, Limits
from workload.batch_api.pools import PoolSettings
from workload.batch_api.queue_metrics import QueueMetrics
from workload.batch_api.quotas import Quotas
from workload.batch_api.s3_store import S3Store, s3_client
from workload.batch_api.service import BatchService
from workload.batch_api.sfn_executor import STOP_WAIT_S, StepFunctionsExecutor
from workload.batch_api.tenants import DEFAULT_SCOPE, MIN_KEY_CHARS, SCOPES
from workload.batch_api.webhooks import ENV_SECRET as WEBHOOKS_SECRET
from workload.batch_api.webhooks import WebhookSource

LAMBDA_PAYLOAD_BYTES = 6 * 1024 * 1024  # Lambda quotas: "6 MB each for request and response (synchronous)"
# What fits a payload once base64 (4/3) and the event's own JSON (headers, request context: a few KB) are added.
FRONT_BODY_BYTES = 4 * 1024 * 1024

_built: dict[str, Any] = {}


class FrontConfigError(ValueError):
    """A setting of the function is missing or wrong: the cold start fails, naming it."""


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise FrontConfigError(f"the Batch API function needs {name} (set by the stack's batch_api component)")
    return value


def pool_settings_from_env(env: Mapping[str, str]) -> PoolSettings:
    """How many batches share a run on the tiers (a newcomer joins when the execution's run ends: pools.py)."""
    value = env.get("LLM_BATCH_POOL_BATCHES", "").strip() or "1"
    try:
        return PoolSettings(max_batches=int(value))
    except ValueError:
        raise FrontConfigError(f"LLM_BATCH_POOL_BATCHES must be a whole number of at least 1, got {value!r}") from None


def max_image_bytes_from_env(env: Mapping[str, str]) -> int | None:
    """The largest `vision` file the front keeps: the stack's job input.max_image_bytes, which the job applies
    again to each image it reads (the pool spec hands it the batch's files, pools.py)."""
    value = env.get("LLM_BATCH_MAX_IMAGE_BYTES", "").strip()
    if not value:
        return None
    try:
        most = int(value)
    except ValueError:
        most = 0
    if most < 1:
        raise FrontConfigError(f"LLM_BATCH_MAX_IMAGE_BYTES must be a whole number of bytes, at least 1, got {value!r}")
    return most


def _stop_wait_s(env: Mapping[str, str]) -> float:
    value = env.get("LLM_BATCH_STOP_WAIT_S", "").strip()
    if not value:  # a front deployed before the stack set it: the executor's own (the small tier's) bound
        return STOP_WAIT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise FrontConfigError(f"LLM_BATCH_STOP_WAIT_S must be a positive number of seconds, got {value!r}")
    return seconds


def _release(session: Any, function: str | None) -> Callable[[], None] | None:
    """The EKS tiers' release after a stop: the nightly submit function's `release` action, invoked asynchronously
    (it deletes the RayJob through the cluster's API; the HTTP function has 29 s in all), as the machine's own
    release step would have run it."""
    if function is None:
        return None
    client = session.client("lambda")

    def release() -> None:
        client.invoke(FunctionName=function, InvocationType="Event", Payload=b'{"action": "release"}')

    return release


def stop_by_tick(session: Any, function: str) -> Callable[[str], None]:
    """The HTTP function's cancel (issue 60): it may not stop executions, so it asks the tick function to, in an
    asynchronous invoke (allowed on that one function) that returns at once, and the tick stops the run within
    seconds instead of at its next scheduled minute. A lost event is caught up by that tick (the scheduler
    stops every cancelling batch's run on every tick)."""
    client = session.client("lambda")

    def stop(batch_id: str) -> None:
        payload = json.dumps({"stop_batch": batch_id}).encode()
        try:
            client.invoke(FunctionName=function, InvocationType="Event", Payload=payload)
        except Exception as error:  # throttled, unreachable: the cancel is recorded and the next tick stops the run
            print(f"llm-batch batch-api: batch {batch_id} cancelled; asking the tick failed ({error}), "
                  "its next scheduled run stops it", flush=True)  # fmt: skip

    return stop


def build_metrics(env: Mapping[str, str]) -> QueueMetrics:
    return QueueMetrics(_required(env, "LLM_BATCH_METRICS_NAMESPACE"), _required(env, "LLM_BATCH_STACK"))


def build_events(env: Mapping[str, str], session: Any) -> EventConfig | None:
    """Where the batches' events go: the stack's default bus and each key's webhook (events.py); None: nowhere.
    Nothing is read or sent here: the webhooks' secret is read by the tick's first send."""
    bus, secret = env.get("LLM_BATCH_EVENT_BUS", "").strip(), env.get(WEBHOOKS_SECRET, "").strip()
    if not bus and not secret:
        return None
    return EventConfig(
        stack=env.get("LLM_BATCH_STACK", "").strip(),
        bus=EventBridgeBus(session.client("events"), bus) if bus else None,
        hooks=WebhookSource(secret_id=secret, secrets_client=session.client("secretsmanager")) if secret else None,
    )


def build_service(env: Mapping[str, str], session: Any = None) -> BatchService:
    import boto3

    session = session or boto3.Session()
    store = S3Store(
        s3_client(session),
        _required(env, "LLM_BATCH_BUCKET"),
        env.get("LLM_BATCH_API_PREFIX", "batch-api/"),
        env.get("LLM_BATCH_KMS_KEY_ID") or None,
    )
    group = env.get("LLM_BATCH_GPU_GROUP") or None
    capacity = (session.client("autoscaling"), group) if group else None
    release = _release(session, env.get("LLM_BATCH_RELEASE_FUNCTION") or None)
    executor = StepFunctionsExecutor(
        session.client("stepfunctions"),
        store,
        _required(env, "LLM_BATCH_STATE_MACHINE_ARN"),
        capacity,
        stop_wait_s=_stop_wait_s(env),
        release=release,
    )
    limits = Limits(inline_download_bytes=FRONT_BODY_BYTES, max_image_bytes=max_image_bytes_from_env(env))
    try:
        quotas = Quotas.from_env(env)
    except ValueError as error:
        raise FrontConfigError(str(error)) from None
    model = _required(env, "LLM_BATCH_MODEL")
    served = tuple(name for name in env.get("LLM_BATCH_SERVED_MODELS", "").split(",") if name.strip())
    pooling = pool_settings_from_env(env)
    events = build_events(env, session)
    service = BatchService(
        store, executor, model, limits, quotas=quotas, served_models=served, pool_settings=pooling, events=events
    )
    if tick := env.get("LLM_BATCH_TICK_FUNCTION"):  # the HTTP function's (infra/components/batch_api.py)
        service.stop_run = stop_by_tick(session, tick)
    return service


def build_handler(env: Mapping[str, str], session: Any = None) -> Any:
    """The Mangum handler over the app; keys from the environment's source (the Secrets Manager secret); after
    each request, the batches it closed failed as a metrics line."""
    from mangum import Mangum

    scope = env.get("LLM_BATCH_API_SCOPE") or DEFAULT_SCOPE
    if scope not in SCOPES:
        raise FrontConfigError(f"LLM_BATCH_API_SCOPE must be 'key' or 'project', got {scope!r}")
    source = KeySource.from_env(env)
    if not source.configured:  # the front is on the internet: never without a key
        raise FrontConfigError("the Batch API function needs LLM_BATCH_API_KEY_SECRET (the Batch API's key secret)")
    metrics = build_metrics(env)
    secrets = session.client("secretsmanager") if session is not None else None
    keys = ApiKeys(source, secrets_client=secrets, min_chars=MIN_KEY_CHARS)
    service = build_service(env, session)
    app = build_app(service, keys, scope)
    # lifespan off: the app has no startup work, and a Lambda has no shutdown to run it at.
    serve = Mangum(cast(Any, app), lifespan="off")  # Starlette's ASGIApp and Mangum's ASGI type: the same shape

    def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], serve(event, context))
        finally:
            if (line := metrics.after_request(service)) is not None:
                print(line, flush=True)

    return handle


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if "http" not in _built:
        _built["http"] = build_handler(os.environ)
    return _built["http"](event, context)


def tick(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The schedule's target: one tick of the queue (start the next batch, follow the running one, expire, sweep).
    `{"start_batch": ID}` (what `python -m infra.run STACK --batch ID` sends) starts that queued batch now;
    `{"next_batch": {"execution_arn", "asked_at", "polls", "max_polls", "poll_budget"}}` (the machine's NextBatch
    step) claims the next queued run for that execution; `{"enqueue_night": TIME}` (the nightly schedule, with
    the Batch API on) queues the night, then ticks, so a night with nothing running starts at once."""
    if "service" not in _built:
        _built["metrics"], _built["service"] = build_metrics(os.environ), build_service(os.environ)
    service, metrics = _built["service"], _built["metrics"]
    try:
        if "stop_batch" in event:
            return {"status": service.stop_cancelled(str(event["stop_batch"]))}
        if "start_batch" in event:
            return {"status": service.start_now(str(event["start_batch"]))}
        if "next_batch" in event:
            asked = event["next_batch"]
            answer = service.next_run(
                str(asked["execution_arn"]),
                int(asked.get("polls") or 0),
                int(asked["max_polls"]),
                int(asked["poll_budget"]),
                str(asked["asked_at"]) if asked.get("asked_at") else None,
            )
            # A claim may close a batch (its file deleted, its window passed while it waited): counted as a request's.
            if (line := metrics.after_request(service)) is not None:
                print(line, flush=True)
            return answer
        if "enqueue_night" in event:
            night = service.enqueue_night(str(event["enqueue_night"]))
            _tick(service, metrics)
            return {"status": "queued", "night": night}
    except ApiError as error:  # an operator's mistake, answered in one line (not a failed invocation)
        return {"error": error.message}
    _tick(service, metrics)
    return {"status": "ticked"}


def _tick(service: BatchService, metrics: QueueMetrics) -> None:
    try:
        service.tick()
    except BaseException:
        # What it closed before it stopped is printed now: a failed invocation may be its instance's last.
        if (line := metrics.after_request(service)) is not None:
            print(line, flush=True)
        raise
    print(metrics.after_tick(service), flush=True)
