"""Progress lines on stderr, flushed at once so they interleave sensibly with the engine's own logging."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def say(message: str) -> None:
    print(f"[bench {time.monotonic() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)
