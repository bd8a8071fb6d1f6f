"""Values unknown at preview in the rules' plan (infra/rules/policy_stack.py), without the pack: what counts as
reading one, and which inputs a first preview cannot know. tests/infra/test_policy_pack.py drives the pack."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from infra.ops.stacks import ROOT
from infra.rules.policy_stack import UNKNOWN, UnknownValue, at_first_preview, known, known_plan, verdict
from infra.rules.registry import RULES

Plan = list[dict[str, Any]]


@pytest.mark.parametrize(
    ("read", "path"),
    [
        (lambda v: v["a"], "a"),
        (lambda v: v.get("a"), "a"),
        (lambda v: dict(v), "a"),
        (lambda v: {**v}, "a"),
        (lambda v: list(v.values()), "a"),
        (lambda v: v == {"a": "x", "b": ["y"], "c": {"d": 1}}, "a"),
        (lambda v: v["b"] == ["y"], "b.0"),
        (lambda v: "y" in v["b"], "b.0"),
        (lambda v: list(v["b"]), "b.0"),
        (lambda v: v["b"][:][0], "b.0"),
    ],
)
def test_copying_comparing_or_searching_reads_the_values(read: Callable[[Any], Any], path: str) -> None:
    """As with CrossGuard's proxies, a copy, `==` or `in` touches each value: an unknown cannot leave the plan
    as a plain string and pass or fail a rule as if it were a value."""
    value = known({"a": UNKNOWN, "b": [UNKNOWN], "c": {"d": 1}}, ["r"])
    with pytest.raises(UnknownValue) as raised:
        read(value)
    assert ".".join(raised.value.path) == f"r.{path}"


def test_known_parts_read_as_plain_values() -> None:
    value = known({"a": UNKNOWN, "c": {"d": 1}, "e": ["x"]}, ["r"])
    assert value["c"] == {"d": 1} and dict(value["c"]) == {"d": 1} and "x" in value["e"]
    assert isinstance(value, dict) and isinstance(value["e"], list)
    assert value.get("missing", 3) == 3 and "a" in value


def test_api_routes_waits_for_an_unknown_integration_target(front_plans: dict[str, Plan]) -> None:
    """The route rule used to copy an integration's inputs (`dict(inputs)`), past the check on reads, and then
    failed the route as targeting "04da6b54-...". Now the unknown defers the rule."""
    plan = copy.deepcopy(front_plans["small"])
    integration = next(item for item in plan if item["type"] == "aws:apigatewayv2/integration:Integration")
    integration["inputs"]["integrationUri"] = UNKNOWN
    assert verdict(RULES["api-routes"], front_plans["small"]) == []
    with pytest.raises(UnknownValue) as raised:
        verdict(RULES["api-routes"], known_plan(plan))
    assert raised.value.path[-2:] == ["inputs", "integrationUri"]


def test_a_first_preview_knows_inputs_but_not_what_is_built_from_outputs(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("small")
    preview = {item["name"]: item for item in at_first_preview(plan)}
    offline = {item["name"]: item for item in plan}
    key = preview["kms-key"]
    assert key["id"] == UNKNOWN and key["outputs"]["arn"] == UNKNOWN
    assert key["inputs"]["enableKeyRotation"] is True and key["outputs"].get("enableKeyRotation", True) is True
    # The topic policy names the topic's ARN: unknown as a whole; the bucket's own name is the program's.
    assert preview["alerts-topic-policy"]["inputs"]["policy"] == UNKNOWN
    assert preview["storage-bucket"]["inputs"]["bucket"] == offline["storage-bucket"]["inputs"]["bucket"]
    stack = next(item for item in preview.values() if item["type"] == "pulumi:pulumi:Stack")
    assert stack["outputs"]["tier"] == "small"


def test_the_security_doc_says_where_each_rule_runs(plan_for: Callable[[str], Plan]) -> None:
    """docs/security.md's table of where each rule runs is the one the committed stacks' plans give."""
    from tools.rules_table import SECURITY_DOC, TIERS, table

    written = (ROOT / SECURITY_DOC).read_text()
    expected = table({stack: plan_for(stack) for stack in TIERS})  # each committed tier's stack is named after it
    assert expected in written, f"run `python tools/rules_table.py --write` to update {SECURITY_DOC}"
