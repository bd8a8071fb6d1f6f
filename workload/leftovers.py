"""Stop what a private local Ray left running after `ray.shutdown()`.

Ray kills its worker processes when their raylet goes, but not the processes those workers started themselves. vLLM's
engine core (`VLLM::EngineCore`, a multiprocessing child of the engine actor) then lives on, reparented to init,
holding gigabytes and a core: seen after `workload serve` stopped while Serve's controller failed to shut down in
time (2026-12-01, the serving benchmark's next target ran beside the leaked engine). It also ignores SIGTERM while
busy, hence the SIGKILL after a short grace.

Every process of one session carries one of two marks in its environment: the TMPDIR the session set (Ray's workers
get the driver's environment) or the pid of the session's raylet (`RAY_RAYLET_PID`, which Ray gives each worker and a
child inherits even where the TMPDIR was not passed on). Processes outside the session carry neither.

A process that owns such a session can also die without stopping it (SIGKILL of its process group, as a supervisor
or a container runtime does after a short grace): then nothing of the above runs. `mark_owner` puts a third mark in
the environment every process it starts inherits (`LLM_BATCH_OWNER=<pid>:<start time>`), and starts a watchdog in a
session of its own, out of reach of a signal to the owner's group, that stops every marked process once the owner is
gone. `stop_orphans` stops what carries the mark of an owner that no longer runs (a watchdog that was killed too);
an owner's next start calls it. A mark names one process start, so a reused pid is no owner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_GRACE_S = 5.0
OWNER_VARIABLE = "LLM_BATCH_OWNER"
_WATCH_INTERVAL_S = 0.5


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
    return stop_processes(session_processes(tmpdir, raylet), grace_s)


def stop_processes(pids: list[int], grace_s: float = _GRACE_S) -> list[int]:
    """SIGTERM `pids`, SIGKILL those still running after `grace_s`; returns `pids`."""
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


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, one process."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_mark(pid: int) -> str:
    return f"{pid}:{_start_time(pid)}"


def _owner_alive(mark: str) -> bool:
    pid, _, started = mark.partition(":")
    return pid.isdigit() and _alive(int(pid)) and _start_time(int(pid)) == started


def marked_processes(mark: str | None = None) -> dict[int, str]:
    """Live processes (other than this one) carrying an owner mark, with their mark; only `mark`'s, if given."""
    prefix = f"{OWNER_VARIABLE}=".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or not _alive(int(entry.name)):
            continue
        for variable in _environment_of(int(entry.name)):
            if variable.startswith(prefix):
                value = variable[len(prefix) :].decode(errors="replace")
                if mark is None or value == mark:
                    found[int(entry.name)] = value
                break
    return found


def stop_orphans(grace_s: float = _GRACE_S) -> list[int]:
    """Stop every process whose owner mark names a process that no longer runs; returns their pids."""
    orphans = [pid for pid, mark in marked_processes().items() if not _owner_alive(mark)]
    return stop_processes(orphans, grace_s) if orphans else []


def mark_owner() -> str:
    """Mark this process as the owner of every process it starts from now on, and start its watchdog.

    The watchdog is started before the mark is set, so it does not carry it; it runs in a session of its own, so
    a signal to this process's group does not reach it. Returns the mark."""
    mark = owner_mark(os.getpid())
    subprocess.Popen(
        [sys.executable, "-m", "workload.leftovers", mark],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    os.environ[OWNER_VARIABLE] = mark
    return mark


def watch(mark: str, grace_s: float = _GRACE_S, interval_s: float = _WATCH_INTERVAL_S) -> None:
    """The watchdog: wait for the owner to go, however it went, then stop what it left carrying its mark."""
    while _owner_alive(mark):
        time.sleep(interval_s)
    # Ray's own processes go within seconds of their raylet; a busy engine core or HAProxy does not.
    stop_processes(list(marked_processes(mark)), grace_s)


if __name__ == "__main__":  # python -m workload.leftovers MARK [GRACE_S]
    watch(sys.argv[1], *(float(value) for value in sys.argv[2:3]))
