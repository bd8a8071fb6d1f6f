"""The offline plan: the program runs under mocks for every stack and reports what it would create."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infra.plan import ROOT, PlanError, capture_plan, render_tree
from tests.infra.conftest import STACKS

SHARED_COMPONENTS = {
    "llmbatch:providers:Providers",
    "llmbatch:kms:EncryptionKey",
    "llmbatch:storage:DataBucket",
    "llmbatch:alerts:Alerts",
}


def test_every_tier_has_a_stack_file() -> None:
    assert set(STACKS) >= {"small", "medium", "large"}


@pytest.mark.parametrize("stack", STACKS)
def test_plan_lists_the_shared_components(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    types = {item["type"] for item in plan}
    assert types >= SHARED_COMPONENTS
    for item in plan:
        assert {"type", "name", "parent", "inputs"} <= set(item)
    # Every AWS resource is a child of one of the program's components, not loose in the stack.
    components = {item["urn"] for item in plan if not item["custom"]}
    loose = [item["name"] for item in plan if item["custom"] and item["parent"] not in components]
    assert loose == []


def test_unknown_stack_names_the_known_ones() -> None:
    with pytest.raises(PlanError, match=r"no stack file stacks/Pulumi\.nope\.yaml; stacks: .*small"):
        capture_plan("nope")


def test_cli_prints_a_tree_and_json(plan_for) -> None:
    tree = subprocess.run(
        [sys.executable, "-m", "infra.plan", "small"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert tree == render_tree(plan_for("small")) + "\n"
    assert "aws:s3/bucket:Bucket  storage-bucket" in tree
    listed = json.loads(
        subprocess.run(
            [sys.executable, "-m", "infra.plan", "small", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert listed == plan_for("small")
