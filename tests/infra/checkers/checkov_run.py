"""Run checkov's Kubernetes checks over a folder of manifests; run by the checkers' own virtualenv's Python.

    .venv-checkers/bin/python tests/infra/checkers/checkov_run.py DIR

stdout: {"summary": {...}, "findings": [{"check", "name", "resource", "file"}]}, every failed check of
checkov's `kubernetes` framework (built-in Kubernetes checks and its graph checks). Nothing is downloaded from
Prisma Cloud (`--skip-download`): the checks are the ones in the pinned release.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CHECKOV = Path(sys.executable).parent / "checkov"


def _reports(output: Any) -> list[dict[str, Any]]:
    # One framework gives one report object; checkov prints a list when it ran several.
    return output if isinstance(output, list) else [output]


def main(folder: str) -> int:
    command = [str(CHECKOV), "-d", folder, "--framework", "kubernetes", "-o", "json", "--quiet", "--compact"]
    result = subprocess.run([*command, "--skip-download"], capture_output=True, text=True, check=False)
    # Exit 1 means "failed checks found"; anything else (or no JSON) is checkov itself failing.
    if result.returncode not in (0, 1):
        print(result.stderr[-3000:], file=sys.stderr)
        return 2
    findings, summary = [], {"parsing_errors": 0, "resource_count": 0}
    for report in _reports(json.loads(result.stdout)):
        part = report.get("summary", report)
        summary["parsing_errors"] += int(part.get("parsing_errors", 0))
        summary["resource_count"] += int(part.get("resource_count", 0))
        for check in (report.get("results") or {}).get("failed_checks", []):
            findings.append(
                {
                    "check": check["check_id"],
                    "name": check["check_name"],
                    "resource": check["resource"],
                    "file": check["file_path"],
                }
            )
    json.dump({"summary": summary, "findings": findings}, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
