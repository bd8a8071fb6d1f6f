"""The device the probe runs on: what it is, its memory, and how time and peak memory are read on it."""

from __future__ import annotations

import platform
import socket
import time
from collections.abc import Callable
from typing import Any

import torch


def describe(device: torch.device, kinds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The GPU's name and CUDA total and free memory, beside the kinds-table row whose name it carries."""
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if device.type != "cuda":
        info.update(name="cpu (dry run)", total_mib=None, free_mib=None, kind=None, table=None)
        return info
    free, total = torch.cuda.mem_get_info(device)
    props = torch.cuda.get_device_properties(device)
    kind = match_kind(props.name, total, kinds)
    info.update(
        name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        multiprocessors=props.multi_processor_count,
        total_mib=total // 2**20,
        free_mib=free // 2**20,
        kind=kind,
        table=kinds.get(kind) if kind else None,
    )
    return info


def match_kind(name: str, total_bytes: int, kinds: dict[str, dict[str, Any]]) -> str | None:
    """The table's kind for a CUDA device name ("NVIDIA H100 80GB HBM3" -> h100): the kinds whose name (without
    its size suffix) is in the device name, the one nearest in memory, and only within 10% of it (an L40S is
    not an L4)."""
    lowered = name.lower().replace(" ", "")
    named = [kind for kind in kinds if kind.split("-")[0] in lowered]
    if not named:
        return None
    nearest = min(named, key=lambda kind: abs(kinds[kind]["memory_mib"] * 2**20 - total_bytes))
    return nearest if abs(kinds[nearest]["memory_mib"] * 2**20 - total_bytes) <= 0.1 * total_bytes else None


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Mean seconds of `fn` over `reps` after one warm-up; CUDA events on a GPU (the kernels' time,
    not the launch's), the wall clock on the CPU."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) / 1000 / reps
    began = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - began) / reps


class Peak:
    """Peak bytes allocated above what was held at `start()`; None on the CPU, where torch keeps no such count."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)

    def read(self) -> int | None:
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - self.base)

    def free_bytes(self) -> int | None:
        return int(torch.cuda.mem_get_info(self.device)[0]) if self.device.type == "cuda" else None
