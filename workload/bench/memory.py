"""Peak memory of a mode, sampled the same way in every mode.

On the CPU: the summed proportional set size (PSS, from /proc/PID/smaps_rollup) of the worker process and all its
descendants (vLLM's engine-core and worker processes; Ray's GCS, raylet and worker processes), sampled every
`interval_s` (2 s: reading one process's PSS costs the kernel a walk of its mappings, ~4 ms for a process that
imported torch, and the sampler must not slow what it measures; the KV cache and the weights, which make the peak,
are held for the whole run). PSS charges each shared page (torch's libraries, mapped by every process that imports
it; Ray's object store in /dev/shm) once in all, split between the processes that map it, so the sum is what the
tree costs the machine. Summed RSS would charge the same libraries once per process and favour the tree with fewer
processes. On a GPU: the device's used memory from NVML, which is what decides whether a configuration fits.

With the peak it keeps the PSS of each process role at the sample that made it (`peak_by_role`): what the tree's
peak is made of, which is what a change to the job's memory must move.

The same sampler adds up the CPU seconds each process of the tree spent during the run, grouped by role (vLLM's
engine core, each Ray actor or task, the driver): on a 2-core machine this shows where the job's time goes.
"""

from __future__ import annotations

import threading
import time
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
    if process.pid == psutil.Process().pid:
        return "driver"
    return _python_script(title.split()) or process.name()


def _python_script(argv: list[str]) -> str | None:
    """'python monitor.py' or 'python -m pkg': Ray's helper processes carry no title of their own."""
    if not argv or "python" not in argv[0].rsplit("/", 1)[-1]:
        return None
    for index, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and index + 1 < len(argv):
            return f"python -m {argv[index + 1]}"
        if arg.endswith(".py"):
            return f"python {arg.rsplit('/', 1)[-1]}"
    return None


def pss_bytes(process: psutil.Process) -> int:
    """The kernel's one-line total (smaps_rollup, Linux 4.14+): psutil's memory_full_info parses the whole smaps,
    thousands of mappings for a process that imported torch, and at five samples a second that costs the
    sampler a core-minute a run, enough to slow the figures it measures."""
    try:
        with open(f"/proc/{process.pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        if psutil.pid_exists(process.pid):  # an older kernel without smaps_rollup
            return int(process.memory_full_info().pss)
        raise psutil.NoSuchProcess(process.pid) from None
    except ProcessLookupError:
        raise psutil.NoSuchProcess(process.pid) from None
    return 0


def tree_pss_by_role(root: psutil.Process) -> dict[str, int]:
    """PSS bytes of `root` and its descendants, summed by process role."""
    by_role: dict[str, int] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            size = pss_bytes(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a process that ended between listing and reading holds no memory now
        role = process_role(process)
        by_role[role] = by_role.get(role, 0) + size
    return by_role


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

    def __init__(self, device: Literal["cpu", "gpu"], interval_s: float = 2.0, cpu_interval_s: float = 0.2) -> None:
        self.device = device
        self.interval_s = interval_s
        self.cpu_interval_s = cpu_interval_s  # CPU times are cheap to read; a short-lived process is still seen
        self.peak_bytes = 0
        self.peak_by_role: dict[str, int] = {}  # on the CPU: PSS by process role at the peak's sample
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
        return "nvml-device-used" if self.device == "gpu" else "process-tree-pss"

    @property
    def peak_mib_by_role(self) -> dict[str, int]:
        """The peak's PSS by process role in MiB, largest first (empty on a GPU, where NVML gives one figure)."""
        ordered = sorted(self.peak_by_role.items(), key=lambda item: -item[1])
        return {role: round(size / 2**20) for role, size in ordered}

    def sample(self) -> int:
        """Read the memory now and keep it if it is the peak so far."""
        if self.device == "gpu":
            used = gpu_used_bytes()
        else:
            by_role = tree_pss_by_role(self._root)
            used = sum(by_role.values())
            if used > self.peak_bytes:
                self.peak_by_role = by_role
        self.peak_bytes = max(self.peak_bytes, used)
        return used

    def _run(self) -> None:
        next_memory = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_memory:
                self.sample()
                next_memory = time.monotonic() + self.interval_s
            self._sample_cpu()
            self._stop.wait(self.cpu_interval_s)

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._sample_cpu(first=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        self._sample_cpu()
