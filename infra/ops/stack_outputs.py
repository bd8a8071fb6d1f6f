"""A stack's outputs for the operator tools (run, status): from `pulumi stack output --json` or a file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any


class OutputsError(RuntimeError):
    """The stack's outputs could not be read, or lack what the tool needs."""


def load_outputs(stack: str, outputs_file: str | None = None) -> dict[str, Any]:
    """The stack's outputs; `outputs_file` is a saved `pulumi stack output --json` (CI, or no Pulumi CLI)."""
    if outputs_file:
        path = Path(outputs_file)
        if not path.is_file():
            raise OutputsError(f"outputs file {path} does not exist")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise OutputsError(f"outputs file {path} is not JSON: {error}") from error
    else:
        if shutil.which("pulumi") is None:
            raise OutputsError(
                "the pulumi CLI is not installed; pass --outputs FILE with `pulumi stack output --json` saved"
            )
        result = subprocess.run(
            ["pulumi", "stack", "output", "--json", "--stack", stack],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise OutputsError(f"pulumi stack output failed for stack {stack!r}: {result.stderr.strip()}")
        data = json.loads(result.stdout)
    if not isinstance(data, dict):
        raise OutputsError("stack outputs must be a JSON object")
    return data


def require(outputs: dict[str, Any], *keys: str) -> list[Any]:
    missing = [key for key in keys if not outputs.get(key)]
    if missing:
        raise OutputsError(f"stack outputs lack {', '.join(missing)}; deploy the stack with its nightly run first")
    return [outputs[key] for key in keys]


def boto_session(outputs: dict[str, Any]) -> Any:
    import boto3

    return boto3.session.Session(region_name=outputs.get("region") or None)
