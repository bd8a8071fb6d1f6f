"""Fixtures of the infra tests.

`plan_for(stack) -> list[dict]`: the offline plan of a stack (`infra.ops.plan.capture_plan`: the Pulumi
program run under mocks with stacks/Pulumi.<stack>.yaml), made once per stack per test session and
shared. Each item has `type`, `name`, `urn`, `parent`, `custom`, `provider`, `inputs`, `id`, `outputs` and
`dependencies` (the URNs it waits for); secrets are masked.
`STACKS`: every stack the repository ships; parametrize plan-wide tests over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra.ops.plan import capture_plan
from infra.ops.stacks import STACKS_DIR

STACKS = sorted(path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in STACKS_DIR.glob("Pulumi.*.yaml"))

Plan = list[dict[str, Any]]


@pytest.fixture(scope="session")
def plan_for() -> Callable[[str], Plan]:
    """A callable stack -> plan, caching each stack's plan for the whole session."""
    cache: dict[str, Plan] = {}

    def plan(stack: str) -> Plan:
        if stack not in cache:
            cache[stack] = capture_plan(stack)
        return cache[stack]

    return plan
