"""This node's GPU utilisation, read through NVML (nvidia-ml-py), for the metrics publisher.

Where no NVIDIA driver or GPU exists (a CPU machine, the EKS head pod) `GpuSampler.open()` returns None and
nothing else here runs: no GPU metric is published rather than a misleading zero.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSample:
    """One reading over all of the node's GPUs: means, so one number stands for the node."""

    gpu_count: int
    util_pct: float
    mem_used_pct: float


def mean_sample(samples: Sequence[GpuSample]) -> GpuSample | None:
    """The mean of several readings (an interval's), or None for none."""
    if not samples:
        return None
    return GpuSample(
        gpu_count=max(sample.gpu_count for sample in samples),
        util_pct=sum(sample.util_pct for sample in samples) / len(samples),
        mem_used_pct=sum(sample.mem_used_pct for sample in samples) / len(samples),
    )


class GpuSampler:
    """Reads utilisation of every GPU NVML sees; build it with `open()`."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls) -> GpuSampler | None:
        """A sampler, or None where NVML or a GPU is missing (the normal case on a CPU machine)."""
        try:
            import pynvml
        except ImportError:
            _log.info("nvidia-ml-py not installed: no GPU utilisation metrics")
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            _log.info("no NVIDIA driver (%s): no GPU utilisation metrics", error)
            return None
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        except pynvml.NVMLError as error:
            _log.warning("NVML could not list GPUs (%s): no GPU utilisation metrics", error)
            pynvml.nvmlShutdown()
            return None
        if not handles:
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, handles)

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def sample(self) -> GpuSample | None:
        """One reading; None (with a warning) if NVML fails mid-run, e.g. a GPU fell off the bus."""
        try:
            utils = [float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles]
            memories = [self._nvml.nvmlDeviceGetMemoryInfo(h) for h in self._handles]
        except self._nvml.NVMLError as error:
            _log.warning("NVML reading failed: %s", error)
            return None
        mem_pct = [100.0 * float(m.used) / float(m.total) if m.total else 0.0 for m in memories]
        return GpuSample(
            gpu_count=len(self._handles),
            util_pct=sum(utils) / len(utils),
            mem_used_pct=sum(mem_pct) / len(mem_pct),
        )

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            _log.warning("NVML shutdown failed: %s", error)
