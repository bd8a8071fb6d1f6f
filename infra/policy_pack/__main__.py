"""The policy pack: every rule of `infra.rules.registry.RULES` as one CrossGuard stack policy, run by the
Pulumi CLI on `pulumi preview/up --policy-pack infra/policy_pack` over the engine's resources (docs/security.md).

The rules are the offline gate's own functions (the package infra/rules/, imported from the repository two
folders up, as the program imports its modules),
over the engine's resources read as a plan by `infra.rules.policy_stack`. A rule that reads a value unknown at
preview is reported by CrossGuard as "can't run during preview" (advisory) and judged on `up`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from infra.rules.plan_view import Rule
from infra.rules.policy_stack import UnknownValue, validate_stack
from infra.rules.registry import RULES

NAME = "llm-batch"


def _validate(rule: Rule) -> Any:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        try:
            messages = validate_stack(rule, args.resources)
        except UnknownValue as unknown:
            raise UnknownValueError(unknown.sentinel, unknown.path) from None
        for message in messages:
            report_violation(message, None)

    return validate


def policies() -> list[StackValidationPolicy]:
    return [
        StackValidationPolicy(
            name=name,
            description=rule.check.__doc__.strip().splitlines()[0] if rule.check.__doc__ else rule.fix,
            validate=_validate(rule),
            enforcement_level=EnforcementLevel(rule.enforcement),
        )
        for name, rule in RULES.items()
    ]


if __name__ == "__main__":
    PolicyPack(NAME, policies())
