"""Peak memory of a mode, sampled the same way in every mode.

On the CPU: the summed resident set (RSS) of the worker process and all its descendants (vLLM's engine-core
process; Ray's GCS, raylet and worker processes), sampled every `interval_s`. RSS counts shared pages once
per process, so the figure is an upper bound; it is the same bound in every mode. On a GPU: the device's
used memory from NVML, which is what decides whether a configuration fits.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Literal

import psutil


def tree_rss_bytes(root: psutil.Process) -> int:
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a process that ended between listing and reading holds no memory now
    return total


def gpu_used_bytes() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        used = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            used += int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
        return used
    finally:
        pynvml.nvmlShutdown()


class PeakMemory:
    """A context manager that samples in a background thread and keeps the peak, in bytes."""

    def __init__(self, device: Literal["cpu", "gpu"], interval_s: float = 0.2) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._root = psutil.Process()

    @property
    def source(self) -> str:
        return "nvml-device-used" if self.device == "gpu" else "process-tree-rss"

    def sample(self) -> int:
        return gpu_used_bytes() if self.device == "gpu" else tree_rss_bytes(self._root)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self.sample())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self.peak_bytes = self.sample()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self.sample())
