"""Fixtures of the infra tests.

`plan_for(stack) -> list[dict]`: the offline plan of a stack (`infra.ops.plan.capture_plan`: the Pulumi
program run under mocks with stacks/Pulumi.<stack>.yaml), made once per stack per test session and
shared. Each item has `type`, `name`, `urn`, `parent`, `custom`, `provider`, `inputs`, `id`, `outputs` and
`dependencies` (the URNs it waits for); secrets are masked.
`serve_plan(tier) -> list[dict]`: the same with the online endpoint on (`SERVE_OVERRIDES`, as
`python -m infra.plan --set` sets them), medium and large, also once per tier per session.
`features_on(stack) -> list[dict]`: the stack's plan with every opt-in feature on: the Batch API's front on every
tier and serving on the cluster tiers (`FEATURES_ON`), and the nightly's images prefix (`JOB_IMAGES_ON`), so the
outside checkers and the mutation suites read those resources too.
`STACKS`: every stack the repository ships; parametrize plan-wide tests over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra.ops import deployer_policy
from infra.ops.plan import capture_plan
from infra.ops.stacks import STACKS_DIR

STACKS = sorted(path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in STACKS_DIR.glob("Pulumi.*.yaml"))
# The tiers' own stacks; the others run a model on a tier (large-70b, large-moe) and differ from theirs only in the
# model and its worker group: the checks that run outside tools or the CLI once per stack take the tiers' only.
TIER_STACKS = ["small", "medium", "large"]

Plan = list[dict[str, Any]]
# What a stack sets to serve: the endpoint, and a head node with room for its head beside the nightly one's. The
# medium plan also asks for the internal load balancer; the large one keeps the default ClusterIP Service.
SERVE_ON = dict(deployer_policy.SERVE_ON)
SERVE_OVERRIDES = {"medium": {**SERVE_ON, "serve.internal_load_balancer": True}, "large": SERVE_ON}


@pytest.fixture(scope="session")
def plan_for() -> Callable[[str], Plan]:
    """A callable stack -> plan, caching each stack's plan for the whole session."""
    cache: dict[str, Plan] = {}

    def plan(stack: str) -> Plan:
        if stack not in cache:
            cache[stack] = capture_plan(stack)
        return cache[stack]

    return plan


@pytest.fixture(scope="session")
def front_plans() -> dict[str, Plan]:
    """The small and large plans with the Batch API's front on (infra/components/batch_api.py)."""
    return {tier: capture_plan(tier, deployer_policy.BATCH_API_ON) for tier in ("small", "large")}


@pytest.fixture(scope="session")
def serve_plan() -> Callable[[str], Plan]:
    """A callable tier -> plan with serving on, caching each tier's plan for the whole session."""
    cache: dict[str, Plan] = {}

    def plan(tier: str) -> Plan:
        if tier not in cache:
            cache[tier] = capture_plan(tier, SERVE_OVERRIDES[tier])
        return cache[tier]

    return plan


# The nightly job's images prefix (`job.image_prefix`): no resource of its own, so the deployer policy plans
# without it, but it widens the job's role by one prefix, which the outside checkers and mutation suites must read.
JOB_IMAGES_ON = {"job.image_prefix": "images/"}


def features_overrides(stack: str) -> dict[str, Any]:
    """The `--set` overrides that turn on every opt-in feature the stack's tier has (as the deployer policy plans),
    and the nightly's images prefix."""
    return {**deployer_policy.OPT_IN[stack], **JOB_IMAGES_ON}


@pytest.fixture(scope="session")
def features_on() -> Callable[[str], Plan]:
    """A callable stack -> plan with the Batch API (and, on the cluster tiers, serving) on, cached per session."""
    cache: dict[str, Plan] = {}

    def plan(stack: str) -> Plan:
        if stack not in cache:
            cache[stack] = capture_plan(stack, features_overrides(stack))
        return cache[stack]

    return plan
