"""Stop what a private local Ray left running after `ray.shutdown()`.

Ray kills its worker processes when their raylet goes, but not the processes those workers started themselves. vLLM's
engine core (`VLLM::EngineCore`, a multiprocessing child of the engine actor) then lives on, reparented to init,
holding gigabytes and a core: seen after `workload serve` stopped while Serve's controller failed to shut down in
time (2026-12-01, the serving benchmark's next target ran beside the leaked engine). It also ignores SIGTERM while
busy, hence the SIGKILL after a short grace.

Every process of one session carries one of two marks in its environment: the TMPDIR the session set (Ray's workers
get the driver's environment) or the pid of the session's raylet (`RAY_RAYLET_PID`, which Ray gives each worker and a
child inherits even where the TMPDIR was not passed on). Processes outside the session carry neither.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

_GRACE_S = 5.0


def _environment_of(pid: int) -> list[bytes]:
    try:
        return (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []  # gone, or not ours to read


def raylet_pid() -> int | None:
    """The pid of the raylet this driver started, if it started one (read before `ray.shutdown()`)."""
    from ray._private import ray_constants, worker

    node = worker._global_node
    raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, []) if node is not None else []
    return raylets[0].process.pid if raylets else None


def session_processes(tmpdir: str, raylet: int | None = None) -> list[int]:
    """The live processes (other than this one) whose TMPDIR is `tmpdir` or a folder inside it, or whose
    RAY_RAYLET_PID is `raylet`."""
    in_tmpdir = f"TMPDIR={tmpdir}".encode()
    of_raylet = f"RAY_RAYLET_PID={raylet}".encode() if raylet is not None else None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for variable in _environment_of(int(entry.name)):
            if variable in (in_tmpdir, of_raylet) or variable.startswith(in_tmpdir + b"/"):
                found.append(int(entry.name))
                break
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie holds nothing; its parent (init, for an orphan) reaps it


def stop_session_processes(tmpdir: str, raylet: int | None = None, grace_s: float = _GRACE_S) -> list[int]:
    """SIGTERM every process of the session, SIGKILL those still running after `grace_s`; returns the pids found."""
    pids = session_processes(tmpdir, raylet)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return pids
