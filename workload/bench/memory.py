"""Peak memory of a mode, sampled the same way in every mode.

On the CPU: the summed resident set (RSS) of the worker process and all its descendants (vLLM's engine-core
process; Ray's GCS, raylet and worker processes), sampled every `interval_s`. RSS counts shared pages once
per process, so the figure is an upper bound; it is the same bound in every mode. On a GPU: the device's
used memory from NVML, which is what decides whether a configuration fits.

The same sampler adds up the CPU seconds each process of the tree spent during the run, grouped by role (vLLM's
engine core, each Ray actor or task, the driver): on a 2-core machine this shows where the job's time goes.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Literal

import psutil


def process_role(process: psutil.Process) -> str:
    """A stable name for what a process does: Ray and vLLM set process titles we can group by."""
    try:
        title = " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if title.startswith("VLLM::"):  # vLLM's engine core and its model-runner worker
        return "vllm " + title.removeprefix("VLLM::").split(" ")[0]
    if title.startswith("ray::"):
        # e.g. "ray::MapWorker(MapBatches(vLLMEngineStageUDF))": the stage is the innermost name.
        name = title.removeprefix("ray::").split(" ")[0]
        return "ray " + name.rstrip(")").split("(")[-1].split(".")[0]
    for known in ("raylet", "gcs_server", "dashboard", "log_monitor", "runtime_env"):
        if known in title:
            return f"ray {known}"
    return "driver" if process.pid == psutil.Process().pid else process.name()


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
        self._cpu_start: dict[int, float] = {}
        self._cpu_last: dict[int, tuple[str, float]] = {}

    @property
    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) spent during the run, by process role, largest first."""
        totals: dict[str, float] = {}
        for pid, (role, seconds) in self._cpu_last.items():
            totals[role] = totals.get(role, 0.0) + seconds - self._cpu_start.get(pid, 0.0)
        return {role: round(value, 1) for role, value in sorted(totals.items(), key=lambda item: -item[1])}

    def _sample_cpu(self, first: bool = False) -> None:
        for process in [self._root, *self._root.children(recursive=True)]:
            try:
                times = process.cpu_times()
                seconds = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if first:
                self._cpu_start[process.pid] = seconds
            # Re-read every time: a spawned process sets its title (e.g. VLLM::EngineCore) after it starts.
            role = process_role(process)
            known = self._cpu_last.get(process.pid)
            if role == "gone" and known:
                role = known[0]
            self._cpu_last[process.pid] = (role, seconds)

    @property
    def source(self) -> str:
        return "nvml-device-used" if self.device == "gpu" else "process-tree-rss"

    def sample(self) -> int:
        return gpu_used_bytes() if self.device == "gpu" else tree_rss_bytes(self._root)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self.sample())
            self._sample_cpu()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self.peak_bytes = self.sample()
        self._sample_cpu(first=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self.sample())
        self._sample_cpu()
