"""The run's progress: a redrawn bar at a TTY (`workload.telemetry.terminal`), else a plain line on stderr at an
interval (CI, the container, CloudWatch Logs on the nodes): rows done, failed rows, output tokens per second."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from workload.telemetry import terminal


class Progress:
    def __init__(self, total: int, already: int, attempt: int, every_s: float = 10.0) -> None:
        self.total, self.done, self.attempt, self.every_s = total, already, attempt, every_s
        self.failed = 0
        self.output_tokens = 0
        self.started = time.monotonic()
        self._last = self.started
        self._bar = _bar(terminal.active(), total, already, attempt)

    def advance(self, ok: int, failed: int, output_tokens: int) -> None:
        self.done += ok + failed
        self.failed += failed
        self.output_tokens += output_tokens
        now = time.monotonic()
        if self._bar is not None:
            self._redraw(ok + failed, now)
            return
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            self.print(now)

    def _redraw(self, rows: int, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        self._bar.set_postfix_str(f"{self.failed} failed, {self.output_tokens / elapsed:.0f} output tok/s", False)
        self._bar.update(rows)
        if self.done >= self.total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            owner = terminal.active()
            if owner is not None:
                owner.bar = None
            self._bar = None

    def print(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        share = 100.0 * self.done / self.total if self.total else 100.0
        print(
            f"[llm-batch] attempt {self.attempt}: {self.done}/{self.total} rows ({share:.0f}%), "
            f"{self.failed} failed, {self.output_tokens / elapsed:.0f} output tok/s, {elapsed:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def _columns(stream: Any) -> int:
    """The terminal's width; 100 where it reports none (a pseudo-terminal nobody sized), so the bar still draws."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 100
    except (OSError, ValueError):
        return 100


def _bar(owner: Any, total: int, already: int, attempt: int) -> Any:
    """A tqdm bar on the run's terminal, or None where the progress is plain lines."""
    if owner is None:
        return None
    from tqdm import tqdm

    with owner.lock:
        owner.bar = tqdm(
            total=total,
            initial=already,
            desc=f"[llm-batch] attempt {attempt}",
            unit=" rows",
            file=owner.stream,
            dynamic_ncols=True,
            mininterval=0.5,
            bar_format="{desc}: {n_fmt}/{total_fmt} rows {percentage:3.0f}%|{bar}| {postfix} [{elapsed}<{remaining}]",
        )
    return owner.bar
