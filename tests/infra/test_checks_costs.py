"""The cost checks (infra/rules/checks_costs.py) on real stacks' plans, each shown to fail on an injected mistake.

The plans are the Pulumi program run under mocks with the stack files (tests/infra/conftest.py); every
stack passing every check is part of tests/infra/test_policy.py.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from infra.config import load_stack_config
from infra.ops.stacks import ROOT
from infra.rules.checks_costs import check_cost_scope, check_cost_tag_activation, stack_of
from tests.infra.plan_select import component, only_child

Plan = list[dict[str, Any]]


@pytest.fixture
def medium(plan_for: Callable[[str], Plan]) -> Plan:
    return copy.deepcopy(plan_for("medium"))


def _controls(plan: Plan) -> dict[str, Any]:
    return component(plan, "llmbatch:cost_controls:CostControls", "cost")


def _child(plan: Plan, typ: str) -> dict[str, Any]:
    return only_child(plan, _controls(plan), typ)


def _problems(check: Callable[[Plan], list[Any]], plan: Plan) -> str:
    return "\n".join(str(violation) for violation in check(plan))


def test_the_plan_knows_its_stack(medium: Plan) -> None:
    assert stack_of(medium) == "medium"


def test_a_budget_on_the_shared_cost_center_fails(medium: Plan) -> None:
    """The old filter: CostCenter, which all three stack files share, so each budget saw every stack."""
    budget = _child(medium, "aws:budgets/budget:Budget")
    budget["inputs"]["costFilters"] = [{"name": "TagKeyValue", "values": ["user:CostCenter$ml-platform"]}]
    problems = _problems(check_cost_scope, medium)
    assert "cost-budget" in problems and "not this stack's tag Stack=llm-batch-medium" in problems


def test_a_budget_without_a_filter_fails(medium: Plan) -> None:
    _child(medium, "aws:budgets/budget:Budget")["inputs"].pop("costFilters")
    assert "cost-budget: filters []" in _problems(check_cost_scope, medium)


def test_an_anomaly_monitor_on_another_stack_fails(medium: Plan) -> None:
    monitor = _child(medium, "aws:costexplorer/anomalyMonitor:AnomalyMonitor")
    monitor["inputs"]["monitorSpecification"] = json.dumps(
        {"Tags": {"Key": "Stack", "Values": ["llm-batch-small"], "MatchOptions": ["EQUALS"]}}
    )
    assert "cost-anomaly-monitor" in _problems(check_cost_scope, medium)
    monitor["inputs"]["monitorType"] = "DIMENSIONAL"
    assert "watches the whole account" in _problems(check_cost_scope, medium)


def test_a_cost_report_on_the_cost_center_fails(medium: Plan) -> None:
    report = _child(medium, "aws:lambda/function:Function")
    report["inputs"]["environment"]["variables"] = {
        "COST_CENTER": "ml-platform",
        "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:t",
        "THRESHOLD_USD": "1",
    }
    assert "cost-report: reports on" in _problems(check_cost_scope, medium)


def test_a_tag_activation_nobody_configured_fails(medium: Plan) -> None:
    controls = _controls(medium)
    medium.append(
        {
            "urn": f"{controls['urn']}$aws:costexplorer/costAllocationTag:CostAllocationTag::cost-tag-stack",
            "type": "aws:costexplorer/costAllocationTag:CostAllocationTag",
            "name": "cost-tag-stack",
            "parent": controls["urn"],
            "custom": True,
            "inputs": {"tagKey": "Stack", "status": "Active"},
        }
    )
    assert "cost.activate_cost_allocation_tags is off" in _problems(check_cost_tag_activation, medium)
    controls["inputs"]["activateCostAllocationTags"] = True
    assert check_cost_tag_activation(medium) == []


def test_activation_is_opt_in_and_validated() -> None:
    assert load_stack_config("small", {"cost_center": "cc"}).cost.activate_cost_allocation_tags is False
    config = load_stack_config("small", {"cost_center": "cc", "cost": {"activate_cost_allocation_tags": True}})
    assert config.cost.activate_cost_allocation_tags is True


def test_the_plan_warns_while_activation_is_off() -> None:
    """What an operator sees from `python -m infra.plan small`: the warning, on stderr, naming docs/cost.md."""
    result = subprocess.run(
        [sys.executable, "-m", "infra.plan", "small", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "filter on the cost-allocation tag Stack=llm-batch-small and see no spend" in result.stderr
    assert "docs/cost.md" in result.stderr


def test_a_stack_configured_to_activate_does_so_and_passes() -> None:
    """The opt-in path: the component, under the plan's mocks, activates Stack and CostCenter and no warning."""
    from infra.aws_context import AwsContext
    from infra.components.cost_controls import CostControls, CostControlsArgs
    from infra.ops.plan import run_under_mocks

    context = AwsContext(account_id="123456789012", partition="aws", region="us-east-1", dns_suffix="amazonaws.com")
    args = CostControlsArgs(
        stack="small",
        context=context,
        monthly_budget_usd=400,
        daily_report_threshold_usd=20,
        topic_arn="arn:aws:sns:us-east-1:123456789012:llm-batch-small-alerts",
        key_arn="arn:aws:kms:us-east-1:123456789012:key/k",
        activate_cost_allocation_tags=True,
    )
    plan = run_under_mocks(lambda: CostControls("cost", args), stack="small")
    tags = [item for item in plan if item["type"] == "aws:costexplorer/costAllocationTag:CostAllocationTag"]
    assert sorted(tag["inputs"]["tagKey"] for tag in tags) == ["CostCenter", "Stack"]
    assert check_cost_tag_activation(plan) == []
    assert check_cost_scope(plan) == []
