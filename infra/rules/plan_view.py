"""What every plan check shares: the violation it reports, the failure when it saw nothing, and small readers
of a captured plan (`infra.ops.plan.capture_plan`). Lower than `infra.rules.registry` and the check modules that
it wires in, so they can all import it without a circle.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Resource = Mapping[str, Any]
Plan = Sequence[Resource]
# What a captured plan shows for a Pulumi secret's value (infra.ops.plan_mocks masks them).
SECRET_MASK = "[secret]"


@dataclass(frozen=True)
class Violation:
    check: str
    resource: str  # "<type token> <logical name>"
    problem: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.resource}: {self.problem}"


class NothingMatched(AssertionError):
    """A check found no resource to check: the plan or the check is wrong, never a pass."""


def label(resource: Resource) -> str:
    return f"{resource['type']} {resource['name']}"


def of_type(plan: Plan, *types: str) -> list[Resource]:
    return [item for item in plan if item.get("custom") and item["type"] in types]


def refers_to(item: Resource, key: str, target: Resource, by_id: Callable[[Any], Any] | None = None) -> bool:
    """Whether `item`'s input `key` names `target`. By URN where the plan says which resources fed that input
    (the engine does, at preview too, where every new resource's id is still unknown); else by the input's
    value: `by_id(input)` (the input itself by default) equal to the target's id."""
    fed_by = (item.get("property_dependencies") or {}).get(key)
    if fed_by:
        return str(target["urn"]) in fed_by
    value = item["inputs"].get(key)
    return target.get("id") is not None and (by_id(value) if by_id else value) == target.get("id")


def require_matches(check: str, matched: int, what: str) -> None:
    if matched == 0:
        raise NothingMatched(f"{check}: the plan has no {what}; nothing was checked")


def as_json(value: Any) -> Any:
    """A policy document or other JSON input as data (the provider takes some as strings)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def is_node_class(type_token: str) -> bool:
    return type_token.startswith("kubernetes:karpenter.k8s.aws/") and type_token.endswith(":EC2NodeClass")


def statements(document: Any) -> list[Mapping[str, Any]]:
    parsed = as_json(document)
    if not isinstance(parsed, dict):
        return []
    return [statement for statement in as_list(parsed.get("Statement")) if isinstance(statement, dict)]


ALL_TIERS = frozenset({"small", "medium", "large"})
CLUSTER_TIERS = frozenset({"medium", "large"})


@dataclass(frozen=True)
class Rule:
    """A plan check with the tiers it applies to and the fix its violations call for.

    On a tier outside `tiers` the rule is not run (it has nothing to check there); on its own tiers a rule
    that matches nothing raises NothingMatched, as every check does.
    """

    check: Callable[[Plan], list[Violation]]
    fix: str
    tiers: frozenset[str] = ALL_TIERS
    # What the policy pack does with a violation on a real preview/up (docs/security.md, "Where each rule runs"):
    # "mandatory" stops the deploy, "advisory" warns. The offline gate fails on either.
    enforcement: str = "mandatory"


def tier_of(plan: Plan) -> str | None:
    """The plan's tier, from the stack export `tier` (None when the plan does not say)."""
    stacks = [item for item in plan if item["type"] == "pulumi:pulumi:Stack"]
    tier = stacks[0].get("outputs", {}).get("tier") if stacks else None
    return str(tier) if tier else None


def allow_statements(document: Any) -> list[Mapping[str, Any]]:
    return [statement for statement in statements(document) if statement.get("Effect") == "Allow"]


def action_matches(pattern: str, action: str) -> bool:
    """Whether an IAM action pattern (`*` and `?` wildcards, any case) covers `action`."""
    return fnmatch.fnmatchcase(action.lower(), pattern.lower())


def grants(statement: Mapping[str, Any], action: str) -> bool:
    """Whether an Allow statement's Action (or NotAction) covers `action`."""
    if statement.get("Effect") != "Allow":
        return False
    if "NotAction" in statement:
        return not any(action_matches(str(p), action) for p in as_list(statement.get("NotAction")))
    return any(action_matches(str(p), action) for p in as_list(statement.get("Action")))


def principals(statement: Mapping[str, Any], kind: str = "AWS") -> list[str]:
    """The principals of one kind (AWS, Service, Federated); `Principal: "*"` is the AWS principal `*`."""
    principal = statement.get("Principal")
    if principal == "*":
        return ["*"] if kind == "AWS" else []
    if not isinstance(principal, dict):
        return []
    return [str(value) for value in as_list(principal.get(kind))]
