"""The job's terminal for a person at a TTY: one redrawn progress bar and the product's own lines; the rest in a file.

Ray and vLLM write to the driver's stdout and stderr from Python (their loggers, warnings) and from C++ (the core
worker, the raylet, vLLM's engine processes, which inherit the file descriptors). At a TTY those lines bury the
three the user came for, so for the length of a run:

- file descriptors 1 and 2 point at the run's log file, so every child process and every C-level write lands there;
- `sys.stdout` and `sys.stderr` become routers: a write that starts with the product's prefix (`[llm-batch]`,
  `llm-batch:`) goes to the terminal as well as the log (the summary, an engine restart, a stop, a lost lease); any
  other write goes only to the log;
- the progress is a tqdm bar on the terminal (rows done of total, failed, output tok/s, elapsed, time left), and
  a product line printed while it runs appears above it (tqdm.write), so the bar is never torn.

Where stderr is not a TTY (CI, the container, CloudWatch Logs on the nodes) nothing is redirected: every line is
where it is today, and the progress is a plain line every few seconds (`workload.telemetry.progress`). `--verbose`
keeps the plain behaviour at a TTY too.

tqdm rather than rich: it is already in both locks (huggingface-hub and vLLM use it), it redraws a single line with
a rate and an ETA out of the box, and `tqdm.write` prints above a live bar from any thread; rich's Live display
would take over the whole screen region for a one-line need.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# The product's own lines begin with one of these (the job's notices and the commands' one-line errors).
PRODUCT_PREFIXES = ("[llm-batch]", "llm-batch:", "python -m workload:")
DEFAULT_LOG_DIR = Path(".runs") / "logs"


class _Terminal:
    """The real terminal, kept on a duplicate of the original stderr; one progress bar at most."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.bar: Any = None
        self.lock = threading.Lock()

    def write_line(self, text: str) -> None:
        from tqdm import tqdm

        with self.lock:
            if self.bar is not None:
                for line in text.rstrip("\n").split("\n"):
                    tqdm.write(line, file=self.stream)
            else:
                self.stream.write(text)
                self.stream.flush()


class _Router(io.TextIOBase):
    """A text stream that copies everything to the log and the product's own writes to the terminal too."""

    def __init__(self, terminal: _Terminal, log: IO[str], fileno: int) -> None:
        self.terminal, self.log, self._fileno = terminal, log, fileno
        self._at_line_start = True
        self._to_terminal = False
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fileno  # the log's descriptor: a child given this stream writes to the log

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        with self._lock:
            self.log.write(text)
            self.log.flush()
            # print() writes its text, then the end: a write at the start of a line decides where both go.
            if self._at_line_start and text.strip():
                self._to_terminal = text.lstrip("\n").startswith(PRODUCT_PREFIXES)
            if self._to_terminal:
                self._pending += text
                if self._pending.endswith("\n"):
                    self.terminal.write_line(self._pending)
                    self._pending = ""
            if text:
                self._at_line_start = text.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self.log.flush()


_active: _Terminal | None = None


def active() -> _Terminal | None:
    """The terminal of the run in progress at a TTY, or None (plain lines)."""
    return _active


def wants_display(verbose: bool, stderr: IO[str] | None = None) -> bool:
    stream = sys.stderr if stderr is None else stderr
    try:
        return not verbose and stream.isatty()
    except (AttributeError, ValueError):
        return False


def log_path(log_dir: Path = DEFAULT_LOG_DIR) -> Path:
    return log_dir / f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"


@contextmanager
def run_display(verbose: bool, log_dir: Path = DEFAULT_LOG_DIR) -> Iterator[Path | None]:
    """For a run at a TTY (and not --verbose): engines' logs to a file, the product's lines and a bar on screen.

    Yields the log file's path, or None where nothing is redirected."""
    global _active
    if not wants_display(verbose):
        yield None
        return
    path = log_path(log_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal_stream = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
    terminal = _Terminal(terminal_stream)
    terminal.write_line(f"[llm-batch] Ray's and vLLM's logs: {path} (--verbose shows them here)\n")
    old_stdout, old_stderr = sys.stdout, sys.stderr
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = _Router(terminal, log, 1)
    sys.stderr = _Router(terminal, log, 2)
    _active = terminal
    try:
        yield path
    finally:
        _active = None
        for router in (sys.stdout, sys.stderr):
            router.flush()
        sys.stdout, sys.stderr = old_stdout, old_stderr
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        terminal_stream.close()
        log.close()
