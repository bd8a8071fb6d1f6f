"""The permissions boundary on every role (infra/role_boundary.py): set by one stack transform on every plan's roles,
required by the deployer policy for the role writes that could escalate, and its own document generated and capped.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.aws_context import AwsContext
from infra.ops import deployer_policy
from infra.ops.deployer_actions import BOUNDARY_ARN, BOUNDARY_WRITES, BOUNDED_ROLE_WRITES
from infra.ops.plan_mocks import ACCOUNT_ID
from infra.ops.role_boundary_document import DOCUMENT, boundary_document
from infra.role_boundary import BOUNDARY_POLICY_NAME, boundary_arn, boundary_transform

Plan = list[dict[str, Any]]
EXPECTED_ARN = f"arn:aws:iam::{ACCOUNT_ID}:policy/{BOUNDARY_POLICY_NAME}"


@pytest.fixture(scope="module")
def all_plans(plan_for: Callable[[str], Plan], features_on: Callable[[str], Plan]) -> list[Plan]:
    """Every stack with its opt-in features off and on: every role the program can create."""
    return [plan_for(stack) for stack in deployer_policy.STACKS] + [
        features_on(stack) for stack in deployer_policy.STACKS
    ]


def test_every_role_in_every_plan_carries_the_boundary(all_plans: list[Plan]) -> None:
    roles = [item for plan in all_plans for item in plan if item["type"] == "aws:iam/role:Role"]
    assert len({role["urn"] for role in roles}) >= 10  # the plans do make roles: this is not vacuously true
    unbounded = sorted({role["urn"] for role in roles if role["inputs"].get("permissionsBoundary") != EXPECTED_ARN})
    assert unbounded == [], "roles without the permissions boundary"


def test_the_boundary_arn_is_derived_from_the_callers_account_and_partition() -> None:
    china = AwsContext(
        account_id="210987654321", partition="aws-cn", region="cn-north-1", dns_suffix="amazonaws.com.cn"
    )
    assert boundary_arn(china) == "arn:aws-cn:iam::210987654321:policy/llm-batch-role-boundary"


def test_the_transform_touches_roles_only_and_replaces_another_boundary() -> None:
    import pulumi

    transform = boundary_transform(EXPECTED_ARN)
    opts = pulumi.ResourceOptions()
    bucket = pulumi.ResourceTransformArgs(True, "aws:s3/bucket:Bucket", "data", {"bucket": "b"}, opts)
    assert transform(bucket) is None
    role = pulumi.ResourceTransformArgs(True, "aws:iam/role:Role", "r", {"name": "r", "permissionsBoundary": "x"}, opts)
    result = transform(role)
    assert result is not None
    assert result.props == {"name": "r", "permissionsBoundary": EXPECTED_ARN}


def _allows(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [statement for statement in document["Statement"] if statement["Effect"] == "Allow"]


def test_the_deployers_role_writes_all_require_the_boundary() -> None:
    document = json.loads(deployer_policy.DOCUMENT.read_text())
    granted = set()
    for statement in _allows(document):
        bounded = set(statement["Action"]) & set(BOUNDED_ROLE_WRITES)
        if bounded:
            assert statement["Condition"]["StringEquals"]["iam:PermissionsBoundary"] == BOUNDARY_ARN, statement["Sid"]
            granted |= bounded
    assert granted == set(BOUNDED_ROLE_WRITES)  # each is needed by some plan type, and granted only bounded


def test_the_deployer_can_neither_remove_the_boundary_nor_rewrite_it() -> None:
    statements = json.loads(deployer_policy.DOCUMENT.read_text())["Statement"]
    denies = {statement["Sid"]: statement for statement in statements if statement["Effect"] == "Deny"}
    assert denies["DenyBoundaryRemoval"]["Action"] == ["iam:DeleteRolePermissionsBoundary"]
    assert denies["DenyBoundaryRemoval"]["Resource"] == "*"
    writes = denies["DenyBoundaryPolicyWrites"]
    assert set(writes["Action"]) >= {
        "iam:CreatePolicyVersion",
        "iam:DeletePolicy",
        "iam:SetDefaultPolicyVersion",
        "iam:DeletePolicyVersion",
    }
    assert set(writes["Action"]) == set(BOUNDARY_WRITES)
    assert writes["Resource"] == f"arn:aws:iam::*:policy/{BOUNDARY_POLICY_NAME}"


def test_the_committed_boundary_document_is_the_generated_one() -> None:
    assert json.loads(DOCUMENT.read_text()) == boundary_document(), "stale: run python -m infra.ops.deployer_policy"


def _denied(document: dict[str, Any]) -> list[str]:
    """The patterns the boundary denies unconditionally."""
    return [
        pattern.lower()
        for statement in document["Statement"]
        if statement["Effect"] == "Deny" and "Condition" not in statement
        for pattern in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    ]


def test_the_boundary_denies_role_and_boundary_writes() -> None:
    denied = _denied(boundary_document())
    for action in [*BOUNDED_ROLE_WRITES, *BOUNDARY_WRITES, "iam:CreateUser", "organizations:LeaveOrganization"]:
        assert any(fnmatch.fnmatchcase(action.lower(), pattern) for pattern in denied), action


def test_the_boundary_denies_nothing_the_stacks_roles_are_granted(all_plans: list[Plan]) -> None:
    """The roles' own policies (inline and customer-managed) in every plan keep working under the boundary."""
    denied = _denied(boundary_document())
    needed = set()
    for plan in all_plans:
        for item in plan:
            if item["type"] in {"aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy"}:
                statements = json.loads(item["inputs"]["policy"])["Statement"]
                for statement in statements:
                    if statement["Effect"] == "Allow":
                        action = statement["Action"]
                        needed.update([action] if isinstance(action, str) else action)
    assert "iam:CreateInstanceProfile" in needed  # Karpenter's: the one role that calls IAM
    assert sorted(a for a in needed if any(fnmatch.fnmatchcase(a.lower(), p) for p in denied)) == []
