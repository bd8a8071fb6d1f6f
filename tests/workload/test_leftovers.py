"""What a private Ray session leaves running is stopped, and nothing else.

The stand-ins are real processes: orphaned (double-forked, so init is their parent, as a leaked vLLM engine core's
is) and ignoring SIGTERM, as the engine core was seen to while busy.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from workload.leftovers import (
    OWNER_VARIABLE,
    marked_processes,
    owner_mark,
    session_processes,
    stop_orphans,
    stop_session_processes,
)

_ORPHAN = """
import os, signal, sys, time
if os.fork():
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1)  # let go of the pipe the starter reads to its end
time.sleep(120)
"""


def _orphan(tmpdir: Path, raylet: str | None = None, owner: str | None = None) -> int:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    if raylet is not None:
        env["RAY_RAYLET_PID"] = raylet
    if owner is not None:
        env[OWNER_VARIABLE] = owner
    started = subprocess.run(
        [sys.executable, "-c", _ORPHAN], env=env, stdout=subprocess.PIPE, text=True, check=True, timeout=30
    )
    return int(started.stdout.split()[0])


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_orphan_of_the_session_is_killed_and_a_stranger_survives(tmp_path: Path) -> None:
    session = tmp_path / "llmb-1" / "tmpdir"
    worker_folder = session / "ray-worker"  # a folder inside the session's TMPDIR counts too
    lookalike = tmp_path / "llmb-1" / "tmpdir2"  # shares the prefix, not the folder
    for folder in (worker_folder, lookalike):
        folder.mkdir(parents=True)
    # The third carries only the raylet's mark (a vLLM engine core's environment was seen without the TMPDIR).
    ours = [_orphan(session), _orphan(worker_folder), _orphan(lookalike, raylet="4242")]
    stranger = _orphan(lookalike, raylet="42420")
    try:
        assert sorted(session_processes(str(session), 4242)) == sorted(ours)
        started = time.monotonic()
        assert sorted(stop_session_processes(str(session), 4242, grace_s=1.0)) == sorted(ours)
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(pid) for pid in ours), "a process that ignores SIGTERM was not killed"
        assert _running(stranger), "a process of another session was touched"
    finally:
        for pid in (*ours, stranger):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _wait_gone(pids: list[int], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_the_orphans_of_a_dead_owner_are_stopped_and_a_live_owners_are_not(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()
    orphan = _orphan(tmp_path, owner=f"{owner.pid}:1")  # an owner that has exited (and no process started at tick 1)
    alive = _orphan(tmp_path, owner=owner_mark(os.getpid()))
    try:
        assert marked_processes(f"{owner.pid}:1") == {orphan: f"{owner.pid}:1"}
        assert stop_orphans(grace_s=1.0) == [orphan]
        _wait_gone([orphan])
        assert not _running(orphan), "an orphan that ignores SIGTERM was not killed"
        assert _running(alive), "a process whose owner still runs was touched"
    finally:
        for pid in (orphan, alive):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_the_watchdog_stops_what_its_owner_left_when_the_owner_is_killed(tmp_path: Path) -> None:
    """The owner is SIGKILLed, so nothing of its own runs at its end: only the watchdog can stop its orphan."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mark = owner_mark(owner.pid)
    orphan = _orphan(tmp_path, owner=mark)
    watchdog = subprocess.Popen([sys.executable, "-m", "workload.leftovers", mark, "1"], start_new_session=True)
    try:
        time.sleep(0.5)
        assert _running(orphan) and watchdog.poll() is None, "the watchdog acted while its owner ran"
        owner.kill()
        owner.wait()
        assert watchdog.wait(timeout=20) == 0
        assert not _running(orphan), "the watchdog left its owner's orphan running"
    finally:
        for pid in (orphan, watchdog.pid, owner.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
