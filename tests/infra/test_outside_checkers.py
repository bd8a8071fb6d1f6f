"""Outside checkers over every stack's plan, with every opt-in feature on (the Batch API's front, serving: the
`features_on` fixture, so their policies and manifests are read too): parliament on every IAM document
(identity, trust, key, bucket, topic, queue, secret, repository and endpoint policies), checkov on every
Kubernetes manifest.

Both run in their own virtualenv (`make checkers`, from the hashed requirements/checkers.lock), once per stack over all
that stack's documents (tests/infra/checkers/parliament_run.py) or manifests (checkov_run.py over the files
`infra.rules.k8s_manifests.stack_manifests` gives: every Kubernetes object of the plan, the night's RayJob and
ConfigMap, and every pod template inside a custom resource written out as a Pod). Every finding is either
fixed or listed, with its reason, in tests/infra/checkers/suppressions.yaml; a listed suppression no finding
matches fails too.
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

from infra.ops.stacks import ROOT
from infra.rules import registry
from infra.rules.k8s_manifests import stack_manifests
from tests.infra.conftest import TIER_STACKS as STACKS

Plan = list[dict[str, Any]]
CHECKERS_PYTHON = ROOT / ".venv-checkers" / "bin" / "python"
RUNNER = Path(__file__).parent / "checkers" / "parliament_run.py"
CHECKOV_RUNNER = Path(__file__).parent / "checkers" / "checkov_run.py"
SUPPRESSIONS = Path(__file__).parent / "checkers" / "suppressions.yaml"


def iam_documents(plan: Plan) -> Iterator[tuple[str, Any]]:
    """("<type> <name> <input>", document) for every IAM document the plan creates."""
    for item in plan:
        if not item.get("custom"):
            continue
        for key in registry._DOCUMENT_INPUTS.get(item["type"], ()):
            if item["inputs"].get(key):
                yield f"{item['type']} {item['name']} {key}", registry._json(item["inputs"][key])
        if item["type"] == "aws:iam/role:Role":
            for index, inline in enumerate(registry._as_list(item["inputs"].get("inlinePolicies"))):
                yield f"{item['type']} {item['name']} inlinePolicies[{index}]", registry._json(inline["policy"])


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
def parliament_findings(features_on: Callable[[str], Plan]) -> dict[str, list[dict[str, Any]]]:
    return {stack: parliament(list(iam_documents(features_on(stack)))) for stack in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_parliament_finds_nothing_unexplained(
    parliament_findings: dict[str, list[dict[str, Any]]], features_on: Callable[[str], Plan], stack: str
) -> None:
    documents = [where for where, _ in iam_documents(features_on(stack))]
    kinds = {where.split()[0] for where in documents}
    # The Batch API's roles and policies reach the checker on every tier (serving adds manifests, not documents).
    assert any(" batch-api-policy " in where for where in documents), documents
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


# --- checkov over the Kubernetes manifests ----------------------------------------------------------------


def checkov(manifests: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """checkov's failed Kubernetes checks over `manifests`, written one per file into `folder`."""
    if not CHECKERS_PYTHON.exists():
        pytest.fail(f"{CHECKERS_PYTHON} is missing: run `make checkers` (make test does it first)")
    folder.mkdir(parents=True, exist_ok=True)
    for index, manifest in enumerate(manifests):
        name = re.sub(r"[^a-z0-9.-]+", "-", f"{manifest['kind']}-{manifest['metadata'].get('name', '')}".lower())
        (folder / f"{index:03d}-{name}.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    result = subprocess.run(
        [str(CHECKERS_PYTHON), str(CHECKOV_RUNNER), str(folder)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout)
    # checkov read every file: a manifest it could not parse would otherwise pass unseen.
    assert report["summary"] == {"parsing_errors": 0, "resource_count": len(manifests)}, report["summary"]
    return report


def _checkov_suppression(stack: str, finding: dict[str, Any], suppressions: list[dict[str, Any]]) -> int | None:
    """The entry explaining a finding: same check, resource matched, and the stack listed where it names some."""
    for index, entry in enumerate(suppressions):
        if (
            entry["check"] == finding["check"]
            and re.search(entry["resource"], finding["resource"])
            and stack in entry.get("stacks", STACKS)
        ):
            return index
    return None


@pytest.fixture(scope="module")
def checkov_findings(
    features_on: Callable[[str], Plan], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for stack in STACKS:
        manifests = stack_manifests(features_on(stack))
        found[stack] = checkov(manifests, tmp_path_factory.mktemp(f"k8s-{stack}"))["findings"] if manifests else []
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_checkov_finds_nothing_unexplained(
    checkov_findings: dict[str, list[dict[str, Any]]], features_on: Callable[[str], Plan], stack: str
) -> None:
    manifests = stack_manifests(features_on(stack))
    if not any(item["type"].startswith("kubernetes:") for item in features_on(stack)):
        # The small tier has no cluster: nothing to check, and nothing is silently skipped on an EKS tier.
        assert manifests == [] and checkov_findings[stack] == []
        return
    kinds = {manifest["kind"] for manifest in manifests}
    # What the issue names reaches the checker: the night's RayJob, its pod templates as Pods, RBAC, the
    # NetworkPolicy, the namespace and the service accounts.
    assert {"RayJob", "ConfigMap", "Pod", "Namespace", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    assert "NetworkPolicy" in kinds
    assert "RayService" in kinds  # serving's endpoint, on with the features
    suppressions = yaml.safe_load(SUPPRESSIONS.read_text())["checkov"]
    unexplained = [f for f in checkov_findings[stack] if _checkov_suppression(stack, f, suppressions) is None]
    assert unexplained == [], json.dumps(unexplained, indent=1)[:4000]


def test_every_checkov_suppression_matches_a_finding(checkov_findings: dict[str, list[dict[str, Any]]]) -> None:
    suppressions = yaml.safe_load(SUPPRESSIONS.read_text())["checkov"]
    used = {
        _checkov_suppression(stack, finding, suppressions)
        for stack, findings in checkov_findings.items()
        for finding in findings
    }
    stale = [entry for index, entry in enumerate(suppressions) if index not in used]
    assert stale == [], stale
    assert all(entry["reason"].strip() for entry in suppressions)


def test_checkov_catches_a_real_mistake(plan_for: Callable[[str], Plan], tmp_path: Path) -> None:
    """The checker is alive and reads the Pods written out of the RayJob: a privileged worker is reported."""
    manifests = stack_manifests(plan_for("large"))
    (worker,) = [m for m in manifests if m["kind"] == "Pod" and "workergroupspecs" in m["metadata"]["name"]]
    worker = json.loads(json.dumps(worker))
    worker["spec"]["containers"][0]["securityContext"]["privileged"] = True
    findings = checkov([worker], tmp_path)["findings"]
    assert any(f["check"] == "CKV_K8S_16" for f in findings), findings  # "Container should not be privileged"
