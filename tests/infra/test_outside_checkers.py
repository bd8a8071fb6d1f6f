"""Outside checkers over every stack's plan: parliament on every IAM document (identity, trust, key, bucket,
topic, queue, secret, repository and endpoint policies).

parliament runs in its own virtualenv (`make checkers`, from requirements/checkers.txt), once per stack over
all that stack's documents (tests/infra/checkers/parliament_run.py). Every finding is either fixed or listed,
with its reason, in tests/infra/checkers/suppressions.yaml; a listed suppression no finding matches fails too.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.ops import policy
from infra.ops.stacks import ROOT
from tests.infra.conftest import STACKS

Plan = list[dict[str, Any]]
CHECKERS_PYTHON = ROOT / ".venv-checkers" / "bin" / "python"
RUNNER = Path(__file__).parent / "checkers" / "parliament_run.py"
SUPPRESSIONS = Path(__file__).parent / "checkers" / "suppressions.yaml"


def iam_documents(plan: Plan) -> Iterator[tuple[str, Any]]:
    """("<type> <name> <input>", document) for every IAM document the plan creates."""
    for item in plan:
        if not item.get("custom"):
            continue
        for key in policy._DOCUMENT_INPUTS.get(item["type"], ()):
            if item["inputs"].get(key):
                yield f"{item['type']} {item['name']} {key}", policy._json(item["inputs"][key])
        if item["type"] == "aws:iam/role:Role":
            for index, inline in enumerate(policy._as_list(item["inputs"].get("inlinePolicies"))):
                yield f"{item['type']} {item['name']} inlinePolicies[{index}]", policy._json(inline["policy"])


def parliament(documents: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    if not CHECKERS_PYTHON.exists():
        pytest.fail(f"{CHECKERS_PYTHON} is missing: run `make checkers` (make test does it first)")
    entries = [{"id": where, "policy": document} for where, document in documents]
    result = subprocess.run(
        [str(CHECKERS_PYTHON), str(RUNNER)], input=json.dumps(entries), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    findings: list[dict[str, Any]] = json.loads(result.stdout)
    return findings


def _suppression_for(finding: dict[str, Any], suppressions: list[dict[str, str]]) -> int | None:
    detail = json.dumps(finding["detail"])
    for index, entry in enumerate(suppressions):
        if (
            entry["issue"] == finding["issue"]
            and re.search(entry["document"], finding["id"])
            and re.search(entry["detail"], detail)
        ):
            return index
    return None


@pytest.fixture(scope="module")
def parliament_findings(plan_for: Callable[[str], Plan]) -> dict[str, list[dict[str, Any]]]:
    return {stack: parliament(list(iam_documents(plan_for(stack)))) for stack in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_parliament_finds_nothing_unexplained(
    parliament_findings: dict[str, list[dict[str, Any]]], plan_for: Callable[[str], Plan], stack: str
) -> None:
    kinds = {where.split()[0] for where, _ in iam_documents(plan_for(stack))}
    # Every kind of document the issue names reaches the checker (queues exist on the Karpenter tier only).
    assert {
        "aws:iam/role:Role",
        "aws:iam/policy:Policy",
        "aws:kms/key:Key",
        "aws:s3/bucketPolicy:BucketPolicy",
    } <= kinds
    assert "aws:sns/topicPolicy:TopicPolicy" in kinds
    suppressions = yaml.safe_load(SUPPRESSIONS.read_text())["parliament"]
    unexplained = [f for f in parliament_findings[stack] if _suppression_for(f, suppressions) is None]
    assert unexplained == [], json.dumps(unexplained, indent=1)[:4000]


def test_every_suppression_matches_a_finding(parliament_findings: dict[str, list[dict[str, Any]]]) -> None:
    suppressions = yaml.safe_load(SUPPRESSIONS.read_text())["parliament"]
    used = {_suppression_for(f, suppressions) for findings in parliament_findings.values() for f in findings}
    stale = [entry for index, entry in enumerate(suppressions) if index not in used]
    assert stale == [], stale
    assert all(entry["reason"].strip() for entry in suppressions)


def test_parliament_catches_a_real_mistake(plan_for: Callable[[str], Plan]) -> None:
    # The checker is alive: a misspelt action in the job policy is reported, not suppressed.
    job = next(item for item in plan_for("small") if item["type"] == "aws:iam/policy:Policy")
    document = json.loads(job["inputs"]["policy"])
    document["Statement"].append({"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "arn:aws:s3:::x/*"})
    findings = parliament([("aws:iam/policy:Policy job-access-policy policy", document)])
    assert any(f["issue"] == "UNKNOWN_ACTION" for f in findings), findings
