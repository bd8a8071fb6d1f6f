"""`capture_plan(stack)`: a stack's offline plan (`python -m infra.plan STACK --json`) made in a fresh
interpreter, so each stack gets a fresh Pulumi runtime. Its own module so that `infra.ops.policy` can plan a
stack without importing `infra.ops.plan`, which runs the policy gate (no import circle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from infra.ops.stacks import ROOT, PlanError


def capture_plan(stack: str, overrides: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The stack's plan (see `run_program`), made in a fresh interpreter; raises PlanError when it fails.

    `overrides` (dotted `llm-batch:` keys to values) are set over the stack file, as `--set` does."""
    sets = [f"--set={key}={json.dumps(value)}" for key, value in (overrides or {}).items()]
    result = subprocess.run(
        [sys.executable, "-m", "infra.plan", stack, "--json", "--no-checks", *sets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if result.returncode == 2 and result.stderr.strip():
        # The plan's own error boundary said what is wrong in its last line: pass that on, not the whole log.
        raise PlanError(f"planning stack '{stack}' failed: {result.stderr.strip().splitlines()[-1]}")
    if result.returncode != 0:
        raise PlanError(f"planning stack '{stack}' failed:\n{result.stderr.strip()[-4000:]}")
    plan: list[dict[str, Any]] = json.loads(result.stdout)
    return plan
