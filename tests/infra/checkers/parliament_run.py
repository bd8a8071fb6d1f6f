"""Run parliament over many IAM documents in one process; run by the checkers' own virtualenv's Python.

    .venv-checkers/bin/python tests/infra/checkers/parliament_run.py < documents.json

stdin: a JSON list of {"id": str, "policy": <policy document>}; stdout: a JSON list of findings
{"id", "issue", "severity", "title", "detail", "location"} at severity LOW and above, as `parliament`'s own
CLI reports them (this file imports parliament, so it never runs in the project's virtualenv).
"""

from __future__ import annotations

import json
import sys

from parliament import analyze_policy_string, enhance_finding  # type: ignore[import-not-found]
from parliament.cli import is_finding_filtered  # type: ignore[import-not-found]


def main() -> int:
    findings = []
    for entry in json.load(sys.stdin):
        policy = analyze_policy_string(json.dumps(entry["policy"]), filepath=entry["id"])
        for finding in policy.findings:
            finding = enhance_finding(finding)
            if is_finding_filtered(finding, "LOW"):
                continue
            findings.append(
                {
                    "id": entry["id"],
                    "issue": finding.issue,
                    "severity": finding.severity,
                    "title": finding.title,
                    "detail": finding.detail,
                    "location": finding.location,
                }
            )
    json.dump(findings, sys.stdout, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
