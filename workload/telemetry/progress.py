"""A progress line on stderr while the job runs: rows done, errors, output tokens per second."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, already: int, attempt: int, every_s: float = 10.0) -> None:
        self.total, self.done, self.attempt, self.every_s = total, already, attempt, every_s
        self.failed = 0
        self.output_tokens = 0
        self.started = time.monotonic()
        self._last = self.started

    def advance(self, ok: int, failed: int, output_tokens: int) -> None:
        self.done += ok + failed
        self.failed += failed
        self.output_tokens += output_tokens
        now = time.monotonic()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            self.print(now)

    def print(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        share = 100.0 * self.done / self.total if self.total else 100.0
        print(
            f"[llm-batch] attempt {self.attempt}: {self.done}/{self.total} rows ({share:.0f}%), "
            f"{self.failed} failed, {self.output_tokens / elapsed:.0f} output tok/s, {elapsed:.0f} s",
            file=sys.stderr,
            flush=True,
        )
