"""Run a command and report its wall time and the peak memory of its whole process tree (driver, Ray, vLLM).

`/usr/bin/time` sees one process; the job is twenty-odd. This samples the resident memory of every process in the
command's session from /proc twice a second and prints one JSON line at the end:

    python tools/peak_memory.py -- make demo
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _session_rss(session: int) -> int:
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # field 6 of /proc/PID/stat, counted after the command name
                total += int((stat.parent / "statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print("usage: python tools/peak_memory.py -- COMMAND...", file=sys.stderr)
        return 2
    started = time.monotonic()
    process = subprocess.Popen(command, start_new_session=True)
    peak = 0
    while process.poll() is None:
        peak = max(peak, _session_rss(process.pid))
        time.sleep(0.5)
    report = {
        "command": " ".join(command),
        "exit_code": process.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "peak_rss_gib": round(peak / 2**30, 2),
    }
    print(json.dumps(report), file=sys.stderr)
    return process.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
