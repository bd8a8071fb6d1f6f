"""The process environment one run owns: scratch folders, Ray, and the stop signal.

vLLM and Ray leave sockets, compile caches and logs in TMPDIR and friends; pointing them at a folder the run owns
keeps runs from tripping over each other and leaves nothing behind.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import ray
from ray.data import DataContext

from workload.contract.entrypoint import RAY_NODE_SETTINGS
from workload.leftovers import raylet_pid, stop_session_processes
from workload.telemetry.startup_trace import mark

_SCRATCH_VARIABLES = ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")


@contextmanager
def ray_session(
    device: str,
    runtime_env: dict[str, Any] | None = None,
    preload: tuple[str, ...] = (),
    stopped: threading.Event | None = None,
) -> Iterator[None]:
    """Connect to the cluster in RAY_ADDRESS, or start a private local Ray with scratch folders of its own.

    `runtime_env` is the job-level Ray runtime environment (every worker of this driver gets it). `preload`:
    modules to import while Ray starts (see `_import_in_background`), not waited for once `stopped` is set (a
    stopping job needs none of them)."""
    # Ray's socket paths must stay under ~107 characters: keep the scratch root short.
    scratch = tempfile.mkdtemp(prefix="llmb-", dir="/tmp")
    saved = {name: os.environ.get(name) for name in (*_SCRATCH_VARIABLES, "VLLM_LOGGING_LEVEL", *RAY_NODE_SETTINGS)}
    for name in _SCRATCH_VARIABLES:
        os.environ[name] = os.path.join(scratch, name.lower())
        os.makedirs(os.environ[name], exist_ok=True)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    for variable, setting in RAY_NODE_SETTINGS.items():  # what every tier's node sets (workload/contract/entrypoint.py)
        os.environ.setdefault(variable, setting)
    address = os.environ.get("RAY_ADDRESS")
    with _signals_kept():
        try:
            mark("ray_start")
            preloading = _import_in_background(preload)
            if address:
                ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
            else:
                # Worker logs stay in the scratch folder: failures still reach the driver as exceptions.
                ray.init(
                    include_dashboard=False,
                    _temp_dir=os.path.join(scratch, "ray"),
                    log_to_driver=False,
                    runtime_env=runtime_env,
                )
            while preloading.is_alive() and not (stopped is not None and stopped.is_set()):
                preloading.join(0.1)
            mark("ray_ready")
            context = DataContext.get_current()
            context.enable_progress_bars = False  # the job prints its own progress line
            context.enable_operator_progress_bars = False
            yield
        finally:
            raylet = None if address else raylet_pid()
            _stop_data_executors()
            ray.shutdown()
            if not address:  # the private Ray was ours: so is whatever its workers left running
                stop_session_processes(os.environ["TMPDIR"], raylet)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def _signals_kept() -> Iterator[None]:
    """Keep the job's own SIGTERM/SIGINT handling (StopSignal) through Ray's start, its session and its shutdown.

    Left alone, Ray takes SIGTERM twice over: every `ray.init` (ours, and the one Ray Data LLM's processor makes)
    sets a Python handler that calls `sys.exit(15)`, and the driver's core worker installs a C++ failure-signal
    handler (SIGTERM among its signals) that logs a stack and re-raises it. A SIGTERM in the 8-10 s of `ray.init`
    then ended the job with 15 or an abort (-6) instead of 143 and `_interrupted.json`, so a local cancel failed
    the batch and a node without a Spot notice failed its night. Within this block Ray's `set_sigterm_handler`
    does nothing and the driver's core worker installs no failure handler (Ray's own switch,
    RAY_DISABLE_FAILURE_SIGNAL_HANDLER; workers keep theirs, in their own processes); Python's faulthandler
    stands in for the driver's crash stacks."""
    import faulthandler

    from ray._private import ray_constants
    from ray._private import utils as ray_utils

    saved = ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    had_faulthandler = faulthandler.is_enabled()
    ray_utils.set_sigterm_handler = lambda handler: None
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    if not had_faulthandler:
        faulthandler.enable()
    # A caller with no SIGTERM handler of its own (the benchmark) keeps what Ray would have given it: an exit
    # that runs the cleanup (this session's `finally`), not the default action's instant death.
    main = threading.current_thread() is threading.main_thread()
    default = main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if default:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = saved
        if not had_faulthandler:
            faulthandler.disable()
        if default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit_on_sigterm(number: int, frame: FrameType | None) -> None:
    sys.exit(number)  # what Ray's own handler does


def _stop_data_executors() -> None:
    """Stop Ray Data's streaming executors still running in this process, before Ray itself goes.

    A run stopped by SIGTERM leaves its dataset's executor thread scheduling (the driver's reader thread stays
    blocked in Ray, workload/job/engine_loop.py); `ray.shutdown()` under it crashed the process in `ray.wait`
    (SIGSEGV, exit 139 instead of 143, seen in the container test's stop). Each executor's own shutdown ends its
    loop and joins it (2 s each at most)."""
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    for thread in threading.enumerate():
        if isinstance(thread, StreamingExecutor) and thread.is_alive():
            try:
                thread.shutdown(force=True)
            except Exception as error:  # a failed stop of the executor must not keep Ray from shutting down
                print(f"[llm-batch] stopping a Ray Data executor: {error}", file=sys.stderr)


def _import_in_background(modules: tuple[str, ...]) -> threading.Thread:
    """Import `modules` in a thread while `ray.init` waits for its GCS and raylet processes to come up.

    The job's pipeline module imports vLLM, torch and transformers (Ray Data LLM's processor does, in the driver):
    5-8 s of one core on a 2-core node, which otherwise starts only once Ray is up and delays the engine actor's
    own start by as much. A failed import is not hidden: the caller's own import raises it again."""

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # re-raised where the caller imports it
                return

    thread = threading.Thread(target=load, name="preload-imports", daemon=True)
    thread.start()
    return thread


class StopSignal:
    """SIGTERM/SIGINT: stop taking new work, let the caller commit what is finished, and hard-exit after a grace
    period if committing takes too long (safe: every commit is atomic, an interrupted one is simply redone)."""

    EXIT_CODE = 143  # 128 + SIGTERM, what Kubernetes and the node agent expect from a terminated job

    def __init__(self, grace_period_s: float) -> None:
        self.grace_period_s = grace_period_s
        self.event = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            return
        self.signal_name = signal.Signals(number).name
        self.event.set()
        print(
            f"[llm-batch] {self.signal_name}: stopping; committing finished shards "
            f"(hard exit in {self.grace_period_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        timer = threading.Timer(self.grace_period_s, self._expire)
        timer.daemon = True
        timer.start()

    def _expire(self) -> None:
        print("[llm-batch] grace period over: exiting now", file=sys.stderr, flush=True)
        os._exit(self.EXIT_CODE)

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def install(self) -> None:
        """Take SIGTERM/SIGINT (again: harmless where they are ours already)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for number in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(number, self._handle)
            self._previous.setdefault(number, previous)

    def __enter__(self) -> StopSignal:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
