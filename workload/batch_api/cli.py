"""`python -m workload batch-api --host 127.0.0.1 --port 8100 --data DIR`: the Batch API on this machine.

One process serves the routes (uvicorn) and, in a thread, moves batches on (`BatchService.tick` every
`--tick-s`); the executor runs each batch's job as a child process. On SIGTERM or Ctrl-C the server stops the
running job (which commits what finished) and waits for it, so the next start on the same `--data` resumes it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from starlette.types import ASGIApp

from workload.auth.keys import ApiKeys, KeyConfigError, KeySource, keys_for_host
from workload.batch_api.app import build_app
from workload.batch_api.cli_quotas import add_quota_arguments, quotas_from_args
from workload.batch_api.event_delivery import EventBridgeBus, EventConfig
from workload.batch_api.executor import BatchRun, LocalJobExecutor, check_base_config, job_config
from workload.batch_api.host_guard import HostGuard, served_hosts
from workload.batch_api.objects import DEFAULT_RETENTION_S, OPENAI_MAX_FILE_BYTES, OPENAI_MAX_REQUESTS, Limits
from workload.batch_api.pools import PoolSettings
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore, StoreLocked
from workload.batch_api.tenants import DEFAULT_SCOPE, MIN_KEY_CHARS, SCOPES
from workload.batch_api.webhooks import check_file
from workload.contract.adapter_config import served_names
from workload.contract.config import ConfigError, build_config, read_config_file

# Batches sharing one job here: enough for a few teams' batches beside each other on one engine, few enough that a
# join (which starts the engine again, pools.py) waits for no long queue to be read.
DEFAULT_POOL_BATCHES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (not loopback: an API key is required)")
    parser.add_argument("--port", type=int, default=8100, help="port")
    parser.add_argument("--data", required=True, help="folder for files, batches and the jobs' output")
    parser.add_argument("--config", help="the job config every batch runs with (model, engine); input/output are set")
    parser.add_argument(
        "--scope",
        choices=SCOPES,
        default=DEFAULT_SCOPE,
        help="key: one tenant per key name, admin keys also see project-scope records (the default); "
        "project: every key sees every file and batch (OpenAI's keys of one project)",
    )
    parser.add_argument("--retention-days", type=float, default=DEFAULT_RETENTION_S / 86400, help="files kept")
    parser.add_argument("--max-file-mb", type=float, default=OPENAI_MAX_FILE_BYTES / 1e6, help="upload limit (MB)")
    parser.add_argument("--max-requests", type=int, default=OPENAI_MAX_REQUESTS, help="requests per batch")
    parser.add_argument("--tick-s", type=float, default=1.0, help="how often batches are moved on")
    parser.add_argument(
        "--pool-batches",
        type=int,
        default=DEFAULT_POOL_BATCHES,
        help="queued batches of one endpoint that share one job and its engine (1: each batch runs alone)",
    )
    parser.add_argument(
        "--pool-join-after-s",
        type=int,
        default=PoolSettings.join_after_s,
        help="how long a job runs before a queued batch may stop it to join the next run (its engine starts again)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="a host name clients reach the server by, beyond the bind address (repeat for more); others get 403",
    )
    parser.add_argument(
        "--webhooks",
        metavar="FILE",
        help="each key's webhook: lines `NAME URL whsec_SECRET` (docs/batch-api.md, 'Events and webhooks'); "
        "a closed batch is sent to its key's URL as OpenAI's batch.* event, signed per Standard Webhooks",
    )
    parser.add_argument(
        "--event-bus",
        metavar="BUS",
        help="an EventBridge bus (name or ARN, AWS credentials from the environment) to send every batch state "
        "change to; unset: none",
    )
    add_quota_arguments(parser)


def local_app(service: BatchService, keys: ApiKeys | None, scope: str, hosts: frozenset[str]) -> ASGIApp:
    """The app this server runs: the routes behind the key check, behind the host and origin check
    (host_guard.py: a browser page of another site, or a rebound name, never reaches a route)."""
    return HostGuard(build_app(service, keys, scope), hosts)  # type: ignore[arg-type]


def local_events(webhooks: str | None, event_bus: str | None) -> EventConfig | None:
    """`--webhooks FILE` (read now: a bad file refuses the start, naming the entry) and `--event-bus`; neither:
    no event is recorded or sent."""
    if not webhooks and not event_bus:
        return None
    hooks = check_file(Path(webhooks).expanduser()) if webhooks else None
    bus = None
    if event_bus:
        import boto3

        bus = EventBridgeBus(boto3.client("events"), event_bus)
    return EventConfig(stack="local", bus=bus, hooks=hooks)


class Ticker(threading.Thread):
    """Calls `service.tick()` every `interval_s` until stopped; a failed tick is reported and the next one runs."""

    def __init__(self, service: BatchService, interval_s: float) -> None:
        super().__init__(name="batch-api-ticker", daemon=True)
        self.service, self.interval_s = service, interval_s
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.service.tick()
            except Exception as error:  # one bad tick (a torn record, a full disk) must not stop the queue
                print(f"llm-batch batch-api: tick failed: {type(error).__name__}: {error}", file=sys.stderr)
            self.halt.wait(self.interval_s)


def run(args: argparse.Namespace, exit_bad_config: int) -> int:
    import uvicorn

    try:
        limits = Limits(
            max_file_bytes=int(args.max_file_mb * 1e6),
            max_requests=args.max_requests,
            retention_s=int(args.retention_days * 86400),
        )
        base = read_config_file(args.config)
        check_base_config(base)
        probe = build_config(job_config(base, BatchRun("b", "/in", "/out", "/v1/chat/completions")))
        served, model = probe.model, probe.model.name
        # Vision files are bounded as the job bounds an image; this server's executor hands the job their paths.
        limits = replace(limits, max_image_bytes=probe.input.max_image_bytes)
        keys = keys_for_host(args.host, KeySource.from_env(), "the Batch API", MIN_KEY_CHARS)
        hosts = served_hosts(args.host, args.allowed_host)
        quotas = quotas_from_args(args)
        pooling = PoolSettings(max_batches=args.pool_batches, join_after_s=args.pool_join_after_s)
        events = local_events(args.webhooks, args.event_bus)
        store = LocalStore(args.data)
    except (ValueError, ConfigError, KeyConfigError, StoreLocked) as error:
        print(f"llm-batch batch-api: {error}", file=sys.stderr)
        return exit_bad_config
    executor = LocalJobExecutor(base, Path(store.root) / "runs")
    service = BatchService(
        store, executor, model, limits, quotas=quotas, served_models=served_names(served), pool_settings=pooling,
        events=events,
    )  # fmt: skip
    ticker = Ticker(service, args.tick_s)
    app = local_app(service, keys, args.scope, hosts)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    guard = f"keys from {keys.source.describe()}" if keys else "no key (loopback only)"
    print(
        f"llm-batch batch-api: http://{args.host}:{args.port}/v1 serving model {model!r}, data {store.root}, "
        f"{guard}, scope {args.scope}, hosts {', '.join(sorted(hosts))} (other hosts and other sites' pages: 403)",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn takes SIGTERM/SIGINT while it serves and, once shut down, raises the signal again against the
    # handlers it found: these, so the process lives on to stop the job (not the default, which would kill it
    # here and leave the job running without its server).
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: None)
    ticker.start()
    try:
        server.run()
    finally:
        ticker.halt.set()
        ticker.join()
        executor.close()  # the running job commits what finished; the next start resumes it
        store.close()
    return 0
