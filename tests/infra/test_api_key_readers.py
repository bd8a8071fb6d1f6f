"""Who may read an API key (issue 60, finding 2), read from the plans with the Batch API and serving on (the
`features_on` plans the outside checkers read, so no plan of its own): the Batch API's keys only by its HTTP
function's role, the online endpoint's only by the endpoint's own service accounts' roles, and neither by the
job's policy (the GPU node's instance role on the small tier, the nightly pods' roles on EKS), a node's or the
tick's. Fails on main, where the job's `ReadJobSecrets` named `serve-api-keys`, which was the Batch API's too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

Plan = list[dict[str, Any]]
SECRET = "aws:secretsmanager/secret:Secret"
POLICIES = ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy")
# The only policies that may read each key secret, by the plan's resource names.
READERS = {
    "batch-api-keys": {"batch-api-front-policy"},
    "secrets-serve-api-keys": {"serve-identity-head-policy", "serve-identity-worker-policy"},
}


def _statements(item: dict[str, Any]) -> list[dict[str, Any]]:
    document = item["inputs"]["policy"]
    found = json.loads(document) if isinstance(document, str) else document
    return list(found["Statement"])


def _resources(statement: dict[str, Any]) -> list[str]:
    value = statement.get("Resource", [])
    return value if isinstance(value, list) else [value]


def readers(plan: Plan) -> dict[str, set[str]]:
    """Each key secret's name -> the names of the policies whose statements name its ARN (or a wildcard)."""
    arns = {item["outputs"]["arn"]: item["name"] for item in plan if item["type"] == SECRET and item["name"] in READERS}
    found: dict[str, set[str]] = {name: set() for name in arns.values()}
    for item in plan:
        if item["type"] not in POLICIES:
            continue
        for statement in _statements(item):
            if statement.get("Effect") != "Allow" or "secretsmanager" not in json.dumps(statement.get("Action")):
                continue
            for resource in _resources(statement):
                for arn, name in arns.items():
                    if resource == arn or "*" in resource:
                        found[name].add(item["name"])
    return found


@pytest.mark.parametrize("stack", ["small", "large"])
def test_only_the_fronts_own_roles_read_an_api_key(features_on: Callable[[str], Plan], stack: str) -> None:
    plan = features_on(stack)
    found = readers(plan)
    expected = {"batch-api-keys"} | ({"secrets-serve-api-keys"} if stack != "small" else set())
    assert set(found) == expected  # the secrets exist where their fronts do, and only there
    for secret, policies in found.items():
        assert policies == READERS[secret], secret
    (job,) = [item for item in plan if item["type"] == "aws:iam/policy:Policy" and item["name"] == "job-access-policy"]
    secrets = [r for s in _statements(job) if s["Sid"] == "ReadJobSecrets" for r in _resources(s)]
    assert not [arn for arn in secrets if "api-keys" in arn]
