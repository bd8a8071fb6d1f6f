"""The deploying identity's policy (docs/deployer-policy.json): generated from the plans' resource types through the
action table (infra/ops/deployer_actions.py), every needed action granted, nothing service-wide, roles handed on only
when tagged as the project's, and parliament's findings each fixed or listed with a reason."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.ops import deployer_policy
from infra.ops.deployer_actions import ANYWHERE, LOOKUPS
from infra.ops.deployer_policy import (
    UnknownResourceType,
    actions_for,
    document_for,
    missing_actions,
    outputs,
    parts,
    plan_types,
    policy_size,
)
from infra.ops.stacks import ROOT

Plan = list[dict[str, Any]]
PARLIAMENT = ROOT / ".venv-checkers" / "bin" / "parliament"
SUPPRESSIONS = Path(__file__).parent / "checkers" / "deployer_policy_suppressions.yaml"


@pytest.fixture(scope="module")
def all_plans(plan_for: Callable[[str], Plan], features_on: Callable[[str], Plan]) -> list[Plan]:
    """Every stack with its features off and on (the Batch API, serving: `features_on` plans `OPT_IN`)."""
    assert set(deployer_policy.OPT_IN) == set(deployer_policy.STACKS)
    return [plan_for(stack) for stack in deployer_policy.STACKS] + [
        features_on(stack) for stack in deployer_policy.STACKS
    ]


def committed() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(deployer_policy.DOCUMENT.read_text())
    return document


def test_the_committed_document_is_the_one_the_plans_need(all_plans: list[Plan]) -> None:
    assert committed() == document_for(all_plans), "stale: run python -m infra.ops.deployer_policy"


def test_the_committed_parts_are_the_document_in_managed_policy_sizes(all_plans: list[Plan]) -> None:
    """The whole document is over IAM's 6,144-character managed policy limit: the role takes it as parts."""
    expected = outputs(all_plans)
    committed_parts = sorted(deployer_policy.DOCUMENT.parent.glob("deployer-policy-part-*.json"))
    assert committed_parts == sorted(
        path for path in expected if path not in {deployer_policy.DOCUMENT, deployer_policy.BOUNDARY_DOCUMENT}
    )
    for path in committed_parts:
        assert path.read_text() == expected[path], f"{path.name} stale: run python -m infra.ops.deployer_policy"
        assert policy_size(json.loads(path.read_text())) <= deployer_policy.MANAGED_POLICY_LIMIT, path.name
    together = [statement for path in committed_parts for statement in json.loads(path.read_text())["Statement"]]
    assert together == committed()["Statement"]


def test_a_statement_too_large_for_one_managed_policy_fails_naming_it() -> None:
    document = {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "Huge", "Effect": "Allow", "Action": ["s3:GetObject"] * 500}],
    }
    with pytest.raises(ValueError, match="statement Huge alone is over"):
        parts(document)


def test_every_action_a_plan_type_needs_is_granted(all_plans: list[Plan]) -> None:
    assert missing_actions(committed(), plan_types(all_plans)) == {}


def test_a_document_lacking_an_action_a_plan_needs_is_caught(all_plans: list[Plan]) -> None:
    document = committed()
    for statement in document["Statement"]:
        statement["Action"] = [action for action in statement["Action"] if action != "lambda:UpdateFunctionCode"]
    assert missing_actions(document, plan_types(all_plans)) == {
        "aws:lambda/function:Function": {"lambda:UpdateFunctionCode"}
    }


def test_a_type_the_table_does_not_know_fails_naming_it() -> None:
    with pytest.raises(UnknownResourceType, match=r"aws:rds/instance:Instance"):
        actions_for(["aws:s3/bucket:Bucket", "aws:rds/instance:Instance"])


def test_kubernetes_objects_and_components_need_only_the_look_ups() -> None:
    assert actions_for(["kubernetes:core/v1:Namespace", "llmbatch:storage:DataBucket", "pulumi:providers:aws"]) == set(
        LOOKUPS
    )
    assert {"eks:CreateCluster", "iam:CreateOpenIDConnectProvider"} <= actions_for(["eks:index:Cluster"])


def test_no_service_is_granted_whole_and_identity_writes_are_scoped() -> None:
    for statement in committed()["Statement"]:
        if statement["Effect"] == "Deny":  # the boundary's denies (tests/infra/test_role_boundary.py)
            continue
        actions = statement["Action"]
        assert not [action for action in actions if action.endswith(":*")], statement["Sid"]
        if statement["Resource"] == "*" and "Condition" not in statement:
            writes = [
                action
                for action in actions
                if action.split(":")[0] in {"iam", "kms", "s3", "lambda", "secretsmanager"}
                and not action.split(":")[1].startswith(("Describe", "List"))
                and action not in ANYWHERE
            ]
            assert writes == [], f"{statement['Sid']} grants {writes} on every resource"


def test_pass_role_only_for_the_projects_roles_and_services() -> None:
    [statement] = [s for s in committed()["Statement"] if "iam:PassRole" in s["Action"]]
    assert statement["Action"] == ["iam:PassRole"]
    assert list(statement["Condition"]) == ["StringEquals"]
    condition = statement["Condition"]["StringEquals"]
    assert condition["aws:ResourceTag/Project"] == "llm-batch"
    assert "lambda.amazonaws.com" in condition["iam:PassedToService"]


def test_parliament_findings_are_each_explained() -> None:
    """`parliament --include-community-auditors`: each finding matches a listed reason, each reason a finding."""
    if not PARLIAMENT.exists():
        pytest.fail(f"{PARLIAMENT} is missing: run `make checkers` (make test does it first)")
    result = subprocess.run(
        [str(PARLIAMENT), "--include-community-auditors", "--json"],
        input=deployer_policy.DOCUMENT.read_text(),  # the CLI reads a policy from stdin when given no file
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: it found something
    findings = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    suppressions = yaml.safe_load(SUPPRESSIONS.read_text())
    used: set[int] = set()
    unexplained = []
    for finding in findings:
        text = json.dumps([finding.get("location"), finding.get("detail")])
        matches = [
            index
            for index, entry in enumerate(suppressions)
            if entry["issue"] == finding["issue"] and re.search(entry["match"], text)
        ]
        used.update(matches)
        if not matches:
            unexplained.append(finding)
    assert unexplained == [], f"explain or fix these in {SUPPRESSIONS.name}: {unexplained}"
    assert sorted(set(range(len(suppressions))) - used) == [], "suppressions no finding matches"
