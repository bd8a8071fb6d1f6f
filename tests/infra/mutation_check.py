"""One mistake injected into a real plan, and the check that the rule meant for it catches it: in the gate's own
check, in the policy pack's `validate` (the same reports), and as a refused deploy. Shared by the mutation suites
(test_security_mutations.py, test_added_resource_mutations.py's edits, test_review_mutations.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from infra.rules import registry
from infra.rules.plan_view import Plan
from tests.infra import engine_view


@dataclass(frozen=True)
class Mutation:
    stack: str
    mistake: Callable[[Plan], None]
    rule: str
    resource: str  # the label ("<type> <name>") the violation must name


def assert_caught(mutation: Mutation, plan_of: Callable[[str], Plan]) -> None:
    plan = copy.deepcopy(plan_of(mutation.stack))
    assert registry.RULES[mutation.rule].check(plan) == [], "the real plan must pass the rule before the mistake"
    mutation.mistake(plan)
    violations = registry.RULES[mutation.rule].check(plan)
    assert any(mutation.resource in violation.resource for violation in violations), violations
    # The pack's `validate`, called directly, reports the same (tests/infra/test_policy_pack.py drives its server).
    assert engine_view.pack_reports(
        mutation.rule, plan, mutation.stack, plan_of(mutation.stack)
    ) == engine_view.gate_reports(mutation.rule, violations)
    with pytest.raises(registry.PolicyError, match=f"(?s){mutation.rule}.*fix: "):
        registry.gate(plan)
