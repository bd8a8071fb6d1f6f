"""No live resource is replaced by a change to the program's shape: every URN of the plans recorded by
tools/plan_urns.py is still in today's plan of the same variant, or aliased by a resource in it.

A resource moved under a new parent gets a new URN; Pulumi treats that as a new resource (and deletes the old
one) unless an alias names the old URN. Alias URNs are computed as the Pulumi SDK does (`all_aliases` and
`inherited_child_alias` in pulumi/runtime/resource.py): a resource answers to its own aliases and, under each
alias of its parent, to the URN it would have there. The plans are the session's shared ones (conftest.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from infra.ops.deployer_policy import OPT_IN
from tests.infra.conftest import SERVE_OVERRIDES, Plan
from tools.plan_urns import DATA, VARIANTS

STACK_TYPE = "pulumi:pulumi:Stack"
RECORDS = sorted(DATA.glob("plan_urns_*.json"))


def _urn(stack: str, project: str, typ: str, name: str, parent: str | None) -> str:
    """The URN the engine gives `typ`/`name` under `parent` (a URN; None or the stack: top level)."""
    if parent is None or parent.split("::")[2] == STACK_TYPE:
        return f"urn:pulumi:{stack}::{project}::{typ}::{name}"
    return f"{parent.rsplit('::', 1)[0]}${typ}::{name}"


def _type_and_name(urn: str) -> tuple[str, str]:
    parts = urn.split("::")
    return parts[2].split("$")[-1], parts[3]


def answered_urns(plan: Plan) -> set[str]:
    """Every URN a resource of `plan` holds: its own and those its aliases (and its parents' aliases) name."""
    by_urn = {item["urn"]: item for item in plan}
    head, project = next(iter(by_urn)).split("::")[:2]  # urn:pulumi:<stack>::<project>::...
    stack = head.rsplit(":", 1)[1]

    @cache
    def aliases(urn: str) -> frozenset[str]:
        item = by_urn[urn]
        own: set[str] = set()
        for alias in item.get("aliases", []):
            if "urn" in alias:
                own.add(alias["urn"])
                continue
            parent = None if alias.get("noParent") else alias.get("parentUrn") or item["parent"]
            own.add(
                _urn(
                    alias.get("stack") or stack,
                    alias.get("project") or project,
                    alias.get("type") or item["type"],
                    alias.get("name") or item["name"],
                    parent,
                )
            )
        inherited: set[str] = set()
        parent_item = by_urn.get(item["parent"] or "")
        if parent_item is not None and parent_item["type"] != STACK_TYPE:
            # Under each old URN of the parent, the child and each of its own aliases had a URN too; a child
            # named after its parent ("<parent>-bucket") is renamed with it, as the SDK assumes.
            names = [(item["type"], item["name"]), *map(_type_and_name, own)]
            for parent_alias in aliases(parent_item["urn"]):
                old_parent_name = parent_alias.rsplit("::", 1)[1]
                for typ, name in names:
                    if name.startswith(parent_item["name"]):
                        name = old_parent_name + name[len(parent_item["name"]) :]
                    inherited.add(_urn(stack, project, typ, name, parent_alias))
        return frozenset(own | inherited)

    return set(by_urn) | {alias for urn in by_urn for alias in aliases(urn)}


def lost_urns(recorded: list[str], plan: Plan) -> list[str]:
    """The recorded URNs no resource of `plan` holds: each would be deleted by an `up` of that plan."""
    answered = answered_urns(plan)
    return [urn for urn in recorded if urn not in answered]


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    assert len(RECORDS) == 1, f"expected one URN record in {DATA}, found {[path.name for path in RECORDS]}"
    document: dict[str, Any] = json.loads(RECORDS[0].read_text())
    return document


@pytest.fixture(scope="module")
def variant_plan(
    plan_for: Callable[[str], Plan], front_plans: dict[str, Plan], serve_plan: Callable[[str], Plan]
) -> Callable[[str], Plan]:
    """Variant name -> the session's plan of it (tools/plan_urns.py's VARIANTS are the fixtures' overrides)."""

    def plan(variant: str) -> Plan:
        stack, _, feature = variant.partition("+")
        return {"": plan_for, "batch_api": front_plans.__getitem__, "serve": serve_plan}[feature](stack)

    return plan


def test_variants_are_the_plans_the_fixtures_build(record: dict[str, Any]) -> None:
    """The record's variants, the tool's and the fixtures' overrides are the same, so the check compares like."""
    assert record["variants"] == {name: dict(overrides) for name, (_, overrides) in VARIANTS.items()}
    assert VARIANTS["small+batch_api"][1] == VARIANTS["large+batch_api"][1] == OPT_IN["small"]
    for tier in ("medium", "large"):
        assert VARIANTS[f"{tier}+serve"][1] == SERVE_OVERRIDES[tier]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_recorded_resource_is_replaced(
    record: dict[str, Any], variant_plan: Callable[[str], Plan], variant: str
) -> None:
    lost = lost_urns(record["urns"][variant], variant_plan(variant))
    assert lost == [], f"{variant}: {len(lost)} resources would be replaced (add an alias to their old URN):\n" + (
        "\n".join(lost[:20])
    )


def test_a_missing_alias_is_caught(record: dict[str, Any], variant_plan: Callable[[str], Plan]) -> None:
    """Taking the aliases off the resources that carry them loses the URNs they kept (the check can fail)."""
    plan = copy.deepcopy(variant_plan("large+serve"))
    aliased = [item for item in plan if item.get("aliases")]
    assert aliased, "no resource in the plan carries an alias"
    for item in aliased:
        item["aliases"] = []
    lost = lost_urns(record["urns"]["large+serve"], plan)
    assert len(lost) >= len(aliased)
