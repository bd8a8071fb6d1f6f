"""The plan's dependency graph and the order checks over it (infra/rules/checks_order.py).

The real medium and large plans pass (tests/infra/test_policy.py runs every check over every stack); here
each rule is shown to fail on a copy of a real plan with exactly one edge of the graph taken away.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from infra.rules import checks_order
from infra.rules.plan_view import NothingMatched

Plan = list[dict[str, Any]]


def _one(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and item["name"] == name]
    assert len(found) == 1, f"expected one {type_token} {name}, found {len(found)}"
    return found[0]


@pytest.fixture
def large(plan_for: Callable[[str], Plan]) -> Plan:
    """A private copy of the large stack's plan, free to break."""
    return copy.deepcopy(plan_for("large"))


def _problems(check: str, plan: Plan) -> str:
    return "\n".join(str(violation) for violation in checks_order.CHECKS[check](plan))


def _cut(item: dict[str, Any], *names: str) -> None:
    """Take away the item's edges to resources with these logical names."""
    item["dependencies"] = [urn for urn in item["dependencies"] if urn.rsplit("::", 1)[-1] not in names]


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_the_plan_lists_each_resource_s_dependencies(plan_for: Callable[[str], Plan], stack: str) -> None:
    plan = plan_for(stack)
    urns = {item["urn"] for item in plan}
    for item in plan:
        assert item["parent"] is None or item["parent"] in item["dependencies"]
        assert set(item["dependencies"]) <= urns | {None}, item["name"]
    cluster = _one(plan, "eks:index:Cluster", "eks-cluster")
    # Explicit depends_on, an input fed by another resource's output, a resource reference to a remote component.
    assert cluster["urn"] in _one(plan, "aws:eks/accessEntry:AccessEntry", "nightly-submit-access")["dependencies"]
    assert _one(plan, "aws:kms/key:Key", "kms-key")["urn"] in cluster["dependencies"]
    assert cluster["urn"] in _one(plan, "eks:index:ManagedNodeGroup", "nodes-system")["dependencies"]
    namespace = _one(plan, "kubernetes:core/v1:Namespace", "job-identity-namespace")
    for kind, name in (("Role", "nightly-submit-rbac"), ("RoleBinding", "nightly-submit-rbac-binding")):
        item = _one(plan, f"kubernetes:rbac.authorization.k8s.io/v1:{kind}", name)
        assert namespace["urn"] in item["dependencies"]


def test_an_access_entry_that_does_not_wait_for_its_cluster_fails(large: Plan) -> None:
    _cut(_one(large, "aws:eks/accessEntry:AccessEntry", "nightly-submit-access"), "eks-cluster")
    assert _problems("eks-access-order", large) == (
        "[eks-access-order] aws:eks/accessEntry:AccessEntry nightly-submit-access: "
        "does not wait for eks:index:Cluster eks-cluster, which it names"
    )


def test_waiting_is_transitive_through_the_parent(large: Plan) -> None:
    # Karpenter's node access entry waits through its component, which depends on the node groups.
    entry = _one(large, "aws:eks/accessEntry:AccessEntry", "karpenter-node-access")
    assert not any(urn.endswith("::eks-cluster") for urn in entry["dependencies"])
    assert _problems("eks-access-order", large) == ""
    # (The CoreDNS add-on waits for the system node too: cut both edges.)
    _cut(_one(large, "llmbatch:karpenter:Karpenter", "karpenter"), "nodes-system", "nodes-coredns")
    assert "karpenter-node-access: does not wait for eks:index:Cluster eks-cluster" in _problems(
        "eks-access-order", large
    )


def test_a_namespaced_object_that_does_not_wait_for_its_namespace_fails(large: Plan) -> None:
    _cut(_one(large, "kubernetes:rbac.authorization.k8s.io/v1:Role", "nightly-submit-rbac"), "job-identity-namespace")
    assert _problems("k8s-order", large) == (
        "[k8s-order] kubernetes:rbac.authorization.k8s.io/v1:Role nightly-submit-rbac: "
        "does not wait for kubernetes:core/v1:Namespace job-identity-namespace, its namespace"
    )


def test_a_chart_that_does_not_wait_for_the_system_node_fails(large: Plan) -> None:
    # The operator's chart waits for the always-on system node (the head pool has none at deploy) through its
    # component's depends_on.
    # (Through the CoreDNS add-on, which waits for the system node, it would still wait: cut both edges.)
    _cut(_one(large, "llmbatch:kuberay:KubeRayOperator", "kuberay"), "nodes-system", "nodes-coredns")
    problems = _problems("k8s-order", large)
    chart = "kubernetes:helm.sh/v4:Chart kuberay-operator"
    assert f"{chart}: does not wait for eks:index:ManagedNodeGroup nodes-system" in problems
    # The namespace needs no node: only what runs pods is held to the rule.
    assert "kuberay-namespace" not in problems


def test_an_object_on_a_provider_not_built_from_the_cluster_fails(large: Plan) -> None:
    provider = _one(large, "pulumi:providers:kubernetes", "eks-k8s")
    _cut(provider, "eks-cluster")
    # The nightly cluster-wide RBAC waits for the cluster only through its provider (the rest also through the
    # nodes their component or namespace waits for).
    assert _problems("k8s-order", large).splitlines() == [
        f"[k8s-order] kubernetes:rbac.authorization.k8s.io/v1:{kind} {name}: does not wait for the cluster "
        "(its provider is not built from it)"
        for kind, name in (
            ("ClusterRole", "nightly-submit-nodeclaims"),
            ("ClusterRoleBinding", "nightly-submit-nodeclaims-binding"),
        )
    ]


def test_a_custom_resource_that_does_not_wait_for_its_crd_chart_fails(large: Plan) -> None:
    _cut(_one(large, "kubernetes:karpenter.sh/v1:NodePool", "karpenter-nodepool-gpu-spot"), "karpenter-chart")
    assert _problems("k8s-order", large) == (
        "[k8s-order] kubernetes:karpenter.sh/v1:NodePool karpenter-nodepool-gpu-spot: "
        "does not wait for kubernetes:helm.sh/v4:Chart karpenter-chart, which installs its CRD"
    )


def test_an_exemption_with_a_reason_silences_one_resource(large: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    _cut(_one(large, "aws:eks/accessEntry:AccessEntry", "nightly-submit-access"), "eks-cluster")
    key = ("eks-access-order", "aws:eks/accessEntry:AccessEntry", "nightly-submit-access")
    monkeypatch.setitem(checks_order.EXEMPT, key, "test: the reason would be written here")
    assert _problems("eks-access-order", large) == ""
    assert all(reason.strip() for reason in checks_order.EXEMPT.values())


@pytest.mark.parametrize("check", list(checks_order.CHECKS))
def test_an_eks_plan_with_nothing_to_check_fails(large: Plan, check: str) -> None:
    components_only = [item for item in large if not item["custom"] and not item.get("remote")]
    with pytest.raises(NothingMatched, match="nothing was checked"):
        checks_order.CHECKS[check](components_only)


@pytest.mark.parametrize("check", list(checks_order.CHECKS))
def test_the_small_tier_runs_no_cluster_so_no_rule_applies(plan_for: Callable[[str], Plan], check: str) -> None:
    assert checks_order.CHECKS[check](plan_for("small")) == []
