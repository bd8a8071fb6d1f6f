"""`pulumi up` in a fresh clone gets the environment it needs, and nothing of the engine.

Pulumi.yaml asks Pulumi's pip toolchain for the virtualenv `.venv`, which `pulumi install` / `pulumi up` fill from
the root requirements.txt; that file only includes the hashed requirements/deploy.lock. Here the same lock goes into
a fresh virtualenv (pip's local wheel cache makes it about a minute) and the offline plan of the largest stack
runs there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_pulumi_yaml_names_the_virtualenv_and_the_root_requirements_include_the_deploy_set() -> None:
    options = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["runtime"]["options"]
    assert options == {"toolchain": "pip", "virtualenv": ".venv"}
    lines = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert lines == ["-r requirements/deploy.lock"]


@pytest.mark.slow
def test_the_plan_runs_in_a_virtualenv_holding_only_the_deploy_set(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", "requirements.txt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    for engine in ("ray", "vllm", "torch", "pyarrow"):
        found = subprocess.run([str(python), "-c", f"import {engine}"], capture_output=True, timeout=60)
        assert found.returncode != 0, f"the deploy set brought {engine}"
    plan = subprocess.run(
        [str(python), "-m", "infra.plan", "large"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "resources in" in plan.stdout and "total:" in plan.stdout
