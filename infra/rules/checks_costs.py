"""Plan checks for the cost controls: each stack watches its own spend, and activates tags only when told.

- `cost-scope`: every budget, cost anomaly monitor and cost report filters on the Stack tag with this stack's
  value (`naming.stack_tag_value`). A filter on a value several stacks share (CostCenter), or none at all,
  shows every stack the spend of all of them.
- `cost-tag-activation`: no cost-allocation tag is activated unless the stack's config asks for it
  (`cost.activate_cost_allocation_tags`, recorded on the CostControls component). Activation fails on a
  first deploy (Billing knows a tag about a day after resources carry it) and always in an Organizations
  member account (only the payer account may activate tags).
- `eks-support`: every EKS cluster states its upgrade policy (EKS's own default is EXTENDED: past standard
  support a cluster stays and is billed six times the control plane's price), and its managed node groups run
  the cluster's version, so raising `eks.version` moves them with it (docs/deploy-eks.md).
"""

from __future__ import annotations

import json
from typing import Any

from infra.naming import PROJECT, STACK_TAG_KEY
from infra.rules.plan_view import Plan, Resource, Violation, as_json, label, of_type, require_matches

BUDGET = "aws:budgets/budget:Budget"
ANOMALY_MONITOR = "aws:costexplorer/anomalyMonitor:AnomalyMonitor"
FUNCTION = "aws:lambda/function:Function"
TAG_ACTIVATION = "aws:costexplorer/costAllocationTag:CostAllocationTag"
COST_CONTROLS = "llmbatch:cost_controls:CostControls"
REPORT_SOURCE = "monitoring/cost_report/handler.py"


def stack_of(plan: Plan) -> str:
    """The stack the plan was made for, from its resources' URNs (`urn:pulumi:<stack>::<project>::...`)."""
    stacks = {str(item["urn"]).split("::", 1)[0].removeprefix("urn:pulumi:") for item in plan if item.get("urn")}
    if len(stacks) != 1:
        raise ValueError(f"a plan holds one stack's resources; found stacks {sorted(stacks)}")
    return stacks.pop()


def _budget_problem(inputs: Any, value: str) -> str | None:
    wanted = [{"name": "TagKeyValue", "values": [f"user:{STACK_TAG_KEY}${value}"]}]
    filters = inputs.get("costFilters") or []
    if filters != wanted:
        return f"filters {json.dumps(filters)}, not this stack's tag {STACK_TAG_KEY}={value}"
    return None


def _monitor_problem(inputs: Any, value: str) -> str | None:
    if inputs.get("monitorType") != "CUSTOM":
        return f"a {inputs.get('monitorType')} monitor watches the whole account, not {STACK_TAG_KEY}={value}"
    specification = as_json(inputs.get("monitorSpecification")) or {}
    tags = specification.get("Tags") if isinstance(specification, dict) else None
    if (
        set(specification) != {"Tags"}
        or tags is None
        or tags.get("Key") != STACK_TAG_KEY
        or tags.get("Values") != [value]
    ):
        return f"watches {json.dumps(specification)}, not this stack's tag {STACK_TAG_KEY}={value}"
    return None


def _is_cost_report(item: Resource) -> bool:
    return REPORT_SOURCE in json.dumps(item["inputs"].get("code"), default=str)


def _report_problem(inputs: Any, value: str) -> str | None:
    variables = (inputs.get("environment") or {}).get("variables") or {}
    if variables.get("COST_TAG_KEY") != STACK_TAG_KEY or variables.get("COST_TAG_VALUE") != value:
        shown = {key: variables.get(key) for key in ("COST_TAG_KEY", "COST_TAG_VALUE", "COST_CENTER")}
        return f"reports on {shown}, not this stack's tag {STACK_TAG_KEY}={value}"
    return None


def check_cost_scope(plan: Plan) -> list[Violation]:
    """Every budget, anomaly monitor and cost report names this stack in its tag filter."""
    name = "cost-scope"
    value = f"{PROJECT}-{stack_of(plan)}" if plan else ""
    violations: list[Violation] = []
    matched = 0
    for item in of_type(plan, BUDGET, ANOMALY_MONITOR, FUNCTION):
        if item["type"] == BUDGET:
            problem = _budget_problem(item["inputs"], value)
        elif item["type"] == ANOMALY_MONITOR:
            problem = _monitor_problem(item["inputs"], value)
        elif _is_cost_report(item):
            problem = _report_problem(item["inputs"], value)
        else:
            continue
        matched += 1
        if problem is not None:
            violations.append(Violation(name, label(item), problem))
    require_matches(name, matched, "budget, cost anomaly monitor or cost report")
    return violations


def check_cost_tag_activation(plan: Plan) -> list[Violation]:
    """Cost-allocation tags are activated only by a CostControls component configured to do it."""
    name = "cost-tag-activation"
    controls = [item for item in plan if item["type"] == COST_CONTROLS]
    allowed = {item["urn"] for item in controls if item["inputs"].get("activateCostAllocationTags") is True}
    violations = [
        Violation(
            name,
            label(item),
            "activates a cost-allocation tag, but cost.activate_cost_allocation_tags is off "
            "(it fails on a first deploy and in an Organizations member account)",
        )
        for item in of_type(plan, TAG_ACTIVATION)
        if item.get("parent") not in allowed
    ]
    # Counted by the budgets the components made: a component with nothing inside it checks nothing.
    budgets = [item for item in of_type(plan, BUDGET) if item.get("parent") in {c["urn"] for c in controls}]
    require_matches(name, len(budgets), "CostControls component with a budget")
    return violations


CLUSTER = "eks:index:Cluster"
NODE_GROUP = "eks:index:ManagedNodeGroup"


def check_eks_support(plan: Plan) -> list[Violation]:
    name = "eks-support"
    violations: list[Violation] = []
    # pulumi-eks's Cluster and ManagedNodeGroup are remote components, not custom resources (plan_view.of_type).
    clusters = [item for item in plan if item["type"] == CLUSTER]
    for cluster in clusters:
        support = (cluster["inputs"].get("upgradePolicy") or {}).get("supportType")
        if support not in ("STANDARD", "EXTENDED"):
            violations.append(Violation(name, label(cluster), "no upgradePolicy.supportType: EKS would pick EXTENDED"))
    versions = {str(cluster["inputs"].get("version")) for cluster in clusters}
    for group in (item for item in plan if item["type"] == NODE_GROUP):
        version = group["inputs"].get("version")
        if str(version) not in versions:
            violations.append(Violation(name, label(group), f"version {version}, not the cluster's {sorted(versions)}"))
    require_matches(name, len(clusters), "EKS cluster")
    return violations
