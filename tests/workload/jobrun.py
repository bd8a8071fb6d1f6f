"""Running the job exactly as the image does (`python -m workload ...`), in its own process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from workload.contract.entrypoint import ENTRYPOINT

# Small enough for 2 cores, big enough for several shards to commit one after another.
ENGINE = {"max_model_len": 512, "max_num_seqs": 16, "enforce_eager": True, "cpu_kvcache_space_gib": 1}


def job_command(*args: str) -> list[str]:
    # The image runs ENTRYPOINT; here the same module runs under this interpreter.
    return [sys.executable, *ENTRYPOINT[1:], *args]


def write_config(path: Path, input_uri: str, output_uri: str, cache_dir: Path, **extra: Any) -> Path:
    config = {
        "input": {"uri": input_uri},
        "output": {"uri": output_uri, "shard_rows": 8},
        "model": {"cache_dir": str(cache_dir)},
        "engine": ENGINE,
        "sampling": {"max_tokens": 8, "temperature": 0.0},
        "batch_size": 4,
        "max_concurrent_batches": 2,
        "stages": {"batch_size": 4},
        **extra,
    }
    # A key given as None is left out: the product's default, not this file's.
    config = {key: value for key, value in config.items() if value is not None}
    path.write_text(yaml.safe_dump(config))
    return path


def start_job(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        job_command(*args),
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: what a failpoint or a test kills, and nothing else
    )


def finish(process: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        # Ray and the engine share the driver's process group; leave none of them holding memory.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, output


def run_job(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> tuple[int, str]:
    return finish(start_job(args, env), timeout)


def run_job_at_a_terminal(args: list[str], cwd: Path, timeout: float = 600, columns: int = 120) -> tuple[int, str]:
    """The job as a person at a terminal runs it: stdin, stdout and stderr on one pseudo-terminal of `columns`.

    Returns the exit code and what the terminal received (carriage returns kept, so redraws can be counted)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(
        job_command(*args), cwd=cwd, env=env, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True
    )
    os.close(terminal)
    received = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: every holder of the terminal's other end has closed it
                    break
                if not chunk:
                    break
                received += chunk
            elif process.poll() is not None:
                break
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        os.close(controller)
    return process.returncode, received.decode("utf-8", errors="replace")


def terminal_lines(screen: str) -> list[str]:
    """What a person sees: each line as last drawn (a redrawn progress bar counts once), blank lines dropped."""
    return [line.split("\r")[-1] for line in screen.replace("\r\n", "\n").split("\n") if line.split("\r")[-1].strip()]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
