"""Pick the resource a test means out of a whole stack's plan: by the component that owns it, not by type alone.

Several components make resources of the same type (the cost report's log group beside the job's, the large
tier's us-east-1 billing key beside the stack's key, Karpenter's interruption rules beside the Spot warning
rule), so "the only aws:kms/key:Key in the plan" stops being true as the program grows. Each helper here
asserts that exactly one thing matched, so a test never silently checks the wrong resource.
"""

from __future__ import annotations

from typing import Any

Plan = list[dict[str, Any]]

KEY = "aws:kms/key:Key"


def component(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    """The one component of `type_token` whose logical name is `name` (e.g. `llmbatch:kms:EncryptionKey`, `kms`)."""
    found = [item for item in plan if item["type"] == type_token and item["name"] == name]
    assert len(found) == 1, f"expected one {type_token} named {name!r}, found {len(found)}"
    return found[0]


def children(plan: Plan, parent: dict[str, Any], typ: str) -> list[dict[str, Any]]:
    """The resources of type `typ` whose direct parent is `parent`."""
    return [item for item in plan if item["type"] == typ and item["parent"] == parent["urn"]]


def only_child(plan: Plan, parent: dict[str, Any], typ: str) -> dict[str, Any]:
    """The one resource of type `typ` directly under `parent`."""
    found = children(plan, parent, typ)
    assert len(found) == 1, f"expected one {typ} under {parent['urn']}, found {len(found)}"
    return found[0]


def stack_key(plan: Plan) -> dict[str, Any]:
    """The stack's own KMS key: the one in the `kms` EncryptionKey component (infra/components/foundation.py)."""
    return only_child(plan, component(plan, "llmbatch:kms:EncryptionKey", "kms"), KEY)
