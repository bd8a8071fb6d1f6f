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

from workload.leftovers import session_processes, stop_session_processes

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


def _orphan(tmpdir: Path, raylet: str | None = None) -> int:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    if raylet is not None:
        env["RAY_RAYLET_PID"] = raylet
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
