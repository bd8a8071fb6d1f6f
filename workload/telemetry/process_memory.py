"""This process's resident memory, now and at its peak, from /proc (the job records the driver's in its manifest)."""

from __future__ import annotations

import resource


def _proc_status_mib(key: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{key}:"):
                    return round(int(line.split()[1]) / 1024, 1)  # reported in kB
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """This process's own peak resident memory so far: VmHWM, which starts afresh at exec. (ru_maxrss does not: a
    process started by a large one, as pytest or a benchmark start the job, inherits its parent's peak.)"""
    peak = _proc_status_mib("VmHWM")
    return peak if peak is not None else round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def rss_mib() -> float:
    """This process's resident memory now."""
    current = _proc_status_mib("VmRSS")
    return current if current is not None else peak_rss_mib()
