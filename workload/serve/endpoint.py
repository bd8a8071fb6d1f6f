"""Run the endpoint: check the model source, start Ray and Serve, deploy the app, serve until SIGTERM/SIGINT.

The engine replica fetches the model on its node (workload/serve/replica_model.py); this process fetches none.

Before Ray starts: the API keys are read (none only on loopback: workload/serve/guard.py), whatever a killed
earlier endpoint left running is stopped and the endpoint's ports are checked free, each failing in one line. The
endpoint then marks every process it starts and leaves a watchdog behind it (workload/leftovers.py), so even a
SIGKILL of its process group leaves no engine core and no HAProxy running.

Serve's feature switches are environment variables that Ray reads once, at import, in every process it starts:
they are set here before anything imports `ray.serve` and before Ray starts its workers (which inherit them).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workload.auth.keys import ENV_KEY, is_loopback_host
from workload.contract.serve_config import ServeConfig
from workload.leftovers import mark_owner, stop_orphans
from workload.serve.guard import GuardSettings, guard_settings

APP_NAME = "llm-batch"
EXIT_START_TIMEOUT = 4
HAPROXY_FOLDER = "h"
# Ray Serve's defaults (ray/serve/_private/constants.py), set here so the start can check them before Ray starts.
HAPROXY_STATS_PORT = 8404
HAPROXY_METRICS_PORT = 9101


class PortBusyError(RuntimeError):
    """A port the endpoint needs is taken: the start stops before Ray, in one line naming the port."""


def feature_env(config: ServeConfig, scratch: str) -> dict[str, str]:
    """The environment switches for the Serve features in `config.serve`, and HAProxy's files in `scratch`
    (its default /tmp/haproxy-serve would be shared by every endpoint on the machine)."""
    settings = config.serve
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1" if settings.haproxy else "0",
        "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1" if settings.direct_streaming else "0",
    }
    if is_loopback_host(settings.host) and not os.environ.get("RAY_ADDRESS"):
        # A private local Ray for a loopback endpoint. On Linux Ray takes the machine's network address as the node
        # address and its servers (GCS, raylet, agents, every worker's gRPC port, Serve's replicas) bind every
        # interface; with this it takes the loopback address, as it does on macOS and Windows, and binds 127.0.0.1.
        # Never with RAY_ADDRESS: a driver in a real cluster must register its reachable address.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if settings.haproxy:
        # Short: Serve adds a 56-character folder, and HAProxy's admin socket path must fit in sun_path (108).
        haproxy = os.path.join(scratch, HAPROXY_FOLDER)
        os.makedirs(haproxy, exist_ok=True)
        env.update(
            {
                "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(haproxy, "haproxy.cfg"),
                "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(haproxy, "admin.sock"),
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": haproxy,
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(haproxy, "server-state"),
                # HAProxy's access log goes to syslog at 127.0.0.1:514 by default, through UDP sockets bound on every
                # interface; nothing reads it here. A Unix socket path in the scratch folder opens no port.
                "RAY_SERVE_HAPROXY_LOG_TARGET": os.path.join(haproxy, "log.sock"),
                "RAY_SERVE_HAPROXY_STATS_PORT": str(HAPROXY_STATS_PORT),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(HAPROXY_METRICS_PORT),
            }
        )
    return env


def needed_ports(config: ServeConfig) -> dict[int, str]:
    settings = config.serve
    ports = {settings.port: "the endpoint's port (serve.port / --port)"}
    if settings.haproxy:
        ports[HAPROXY_STATS_PORT] = "HAProxy's stats port (RAY_SERVE_HAPROXY_STATS_PORT)"
        ports[HAPROXY_METRICS_PORT] = "HAProxy's metrics port (RAY_SERVE_HAPROXY_METRICS_PORT)"
    return ports


def check_ports_free(host: str, ports: dict[int, str]) -> None:
    """Raises PortBusyError naming the first port on `host` something already listens on."""
    for port, what in ports.items():
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is free
            try:
                probe.bind((host, port))
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
                raise PortBusyError(
                    f"port {port} on {host} is in use ({what}): stop what listens there or choose another port"
                ) from None


def ray_runtime_env() -> dict[str, Any]:
    """Ray's job-level runtime environment: Serve's listeners kept on the endpoint's addresses (bind_hosts.py)."""
    import ray.cloudpickle

    from workload.serve import bind_hosts

    # A worker runs its setup hook before the driver's code path is on its sys.path, so the hook cannot be named by
    # module path ("No module named 'workload'"): it travels by value instead.
    ray.cloudpickle.register_pickle_by_value(bind_hosts)
    return {"worker_process_setup_hook": bind_hosts.keep_serve_listeners_on_their_hosts}


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def stop_leftover_haproxy(folder: str) -> list[int]:
    """SIGTERM the HAProxy processes started for this endpoint (their command line names its own HAProxy folder).

    Ray Serve runs HAProxy in a process group of its own and, when its controller does not shut down in time (seen
    on 2 busy cores), leaves it running and holding its ports; the next endpoint's HAProxy then cannot bind.
    Only processes naming this endpoint's unique folder are touched.
    """
    stopped = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if any(folder.encode() in argument for argument in arguments):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGTERM)
                stopped.append(int(entry.name))
    return stopped


def _watchdog(ready: threading.Event, timeout_s: float) -> None:
    if not ready.wait(timeout_s):
        print(f"llm-batch serve: the endpoint was not ready within {timeout_s:.0f} s; exiting", file=sys.stderr)
        os._exit(EXIT_START_TIMEOUT)


def serve_until_stopped(config: ServeConfig) -> int:
    """Blocks until SIGTERM or SIGINT; returns the process exit code."""
    from workload.engine.model_source import check_model_source

    scratch = tempfile.mkdtemp(prefix="lsv-", dir="/tmp")
    key = os.environ.pop(ENV_KEY, None)  # travels as a file (guard_settings): Ray's workers inherit this environment
    try:
        guard = guard_settings(config, {**os.environ, **({ENV_KEY: key} if key else {})}, scratch)
        stop_orphans()  # what an endpoint killed with its watchdog left, holding its ports and memory
        check_ports_free(config.serve.host, needed_ports(config))
        # Ray reads its switches once, at import: set them before anything imports it.
        with _environment(feature_env(config, scratch)):
            # A source that cannot be a model stops here, before Ray starts; the replica fetches the model itself.
            check_model_source(config.model)
            mark_owner()
            return _serve(config, guard)
    finally:
        if key is not None:
            os.environ[ENV_KEY] = key
        if config.serve.haproxy:
            stop_leftover_haproxy(os.path.join(scratch, HAPROXY_FOLDER))
        shutil.rmtree(scratch, ignore_errors=True)


def _serve(config: ServeConfig, guard: GuardSettings) -> int:
    from ray import serve

    from workload.runtime import ray_session
    from workload.serve.app import build_app

    settings = config.serve
    ready = threading.Event()
    stop = threading.Event()
    threading.Thread(target=_watchdog, args=(ready, settings.start_timeout_s), daemon=True).start()
    # Before Ray starts: ray_session keeps Ray's own SIGTERM handlers out (workload/runtime.py), so a stop during
    # ray.init lands here too, and the endpoint comes up only to shut down cleanly.
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    with ray_session(config.device, ray_runtime_env()):
        serve.start(http_options={"host": settings.host, "port": settings.port})
        serve.run(build_app(config, guard), name=APP_NAME, route_prefix="/", blocking=False)
        ready.set()
        url = f"http://{settings.host}:{settings.port}/v1"
        print(f"llm-batch serve: ready at {url} (model {settings.model_id!r})", flush=True)
        stop.wait()
        print("llm-batch serve: stopping", file=sys.stderr, flush=True)
        serve.shutdown()
    return 0
