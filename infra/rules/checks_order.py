"""Plan checks over the dependency graph: what AWS or Kubernetes rejects when it is created too early.

Each plan item's `dependencies` (explicit `depends_on`, resources whose outputs feed its inputs, its parent)
and its `provider` are edges to what the engine creates first; a resource waits for everything it can reach
along them. Only kinds that really fail out of order are checked (a blanket "names another resource" rule
would flag log groups named after their functions, policies that name each other, and the like):

- an EKS access entry (policy association, add-on, ...) waits for the cluster it names: EKS answers
  ResourceNotFoundException while the cluster is still being created;
- a namespaced Kubernetes object waits for its Namespace when the plan creates it: the API server answers
  NotFound, and pulumi-kubernetes retries that only briefly;
- every Kubernetes object waits for a cluster of the plan (through its provider), and Helm charts and
  workloads wait for the node groups that have nodes at deploy: Pulumi waits for their pods to be ready;
- a custom resource waits for the chart that installs its CRD ("no matches for kind").

These rules hold for the tiers that run a cluster (medium, large: read from the plan's `tier` export); in
those plans a rule that matches nothing raises NothingMatched, as every check does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from infra.rules.plan_view import NothingMatched, Plan, Resource, Violation, label, require_matches

CLUSTER_TIERS = ("medium", "large")
CLUSTER_TYPES = ("eks:index:Cluster", "aws:eks/cluster:Cluster")
# AWS resources that name their cluster in `clusterName`; EKS rejects each while the cluster is creating.
NAMES_A_CLUSTER = (
    "aws:eks/accessEntry:AccessEntry",
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
    "aws:eks/podIdentityAssociation:PodIdentityAssociation",
    "aws:eks/addon:Addon",
    "aws:eks/fargateProfile:FargateProfile",
)
NODE_GROUP_TYPES = ("eks:index:ManagedNodeGroup", "aws:eks/nodeGroup:NodeGroup")
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
CHART_PREFIX = "kubernetes:helm.sh/"
# Kinds whose creation Pulumi awaits until their pods run, which needs a node; DaemonSets are ready on 0 nodes.
NEEDS_NODES = ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:StatefulSet", "kubernetes:batch/v1:Job")
# API group of a custom resource -> the chart (by name) that installs its CRDs.
CRD_CHARTS = {"karpenter.sh": "karpenter", "karpenter.k8s.aws": "karpenter", "ray.io": "kuberay-operator"}

# (check, type token, logical name) -> why that resource may skip the rule. Keep each reason concrete.
EXEMPT: dict[tuple[str, str, str], str] = {}


def _tier(plan: Plan) -> str | None:
    stacks = [item for item in plan if item["type"] == "pulumi:pulumi:Stack"]
    return str(stacks[0].get("outputs", {}).get("tier")) if stacks else None


def _applies(check: str, plan: Plan) -> bool:
    """Whether the plan runs a cluster; a plan that does not say its tier cannot pass by seeing nothing."""
    tier = _tier(plan)
    if tier is None:
        raise NothingMatched(f"{check}: the plan has no stack export `tier`; nothing was checked")
    return tier in CLUSTER_TIERS


def waits_on(plan: Plan) -> Callable[[Resource], set[str]]:
    """resource -> the URNs of everything it waits for, directly or through what it waits for."""
    edges: dict[str, list[str]] = {}
    for item in plan:
        edges[item["urn"]] = [*item.get("dependencies", []), *([item["provider"]] if item.get("provider") else [])]
    cache: dict[str, set[str]] = {}

    def reach(item: Resource) -> set[str]:
        start = item["urn"]
        if start not in cache:
            seen: set[str] = set()
            todo = list(edges.get(start, []))
            while todo:
                urn = todo.pop()
                if urn not in seen:
                    seen.add(urn)
                    todo.extend(edges.get(urn, []))
            cache[start] = seen
        return cache[start]

    return reach


def _violation(check: str, item: Resource, problem: str) -> list[Violation]:
    if (check, item["type"], item["name"]) in EXEMPT:
        return []
    return [Violation(check, label(item), problem)]


def _cluster_names(plan: Plan) -> dict[str, Resource]:
    return {
        str(item["inputs"].get("name") or item["name"]): item
        for item in plan
        if item["type"] in CLUSTER_TYPES and (item.get("custom") or item.get("remote"))
    }


def check_eks_access_order(plan: Plan) -> list[Violation]:
    """Every access entry, policy association, add-on ... waits for the cluster it names when the plan creates it."""
    name = "eks-access-order"
    if not _applies(name, plan):
        return []
    clusters, reach = _cluster_names(plan), waits_on(plan)
    violations: list[Violation] = []
    matched = 0
    for item in plan:
        if item["type"] not in NAMES_A_CLUSTER:
            continue
        cluster = clusters.get(str(item["inputs"].get("clusterName")))
        if cluster is None:
            continue  # a cluster this plan does not create exists already
        matched += 1
        if cluster["urn"] not in reach(item):
            violations += _violation(name, item, f"does not wait for {label(cluster)}, which it names")
    require_matches(name, matched, "EKS access entry or other resource naming a cluster it creates")
    return violations


def _is_k8s_object(item: Resource) -> bool:
    return item["type"].startswith("kubernetes:") and bool(item.get("custom") or item.get("remote"))


def _namespace_of(item: Resource) -> str | None:
    if item["type"].startswith(CHART_PREFIX):
        return item["inputs"].get("namespace") or None
    return (item["inputs"].get("metadata") or {}).get("namespace") or None


def _chart_name(item: Resource) -> str:
    return str(item["inputs"].get("chart", "")).rstrip("/").rsplit("/", 1)[-1]


def _has_nodes_at_deploy(group: Resource) -> bool:
    scaling = group["inputs"].get("scalingConfig") or {}
    return float(scaling.get("desiredSize") or 0) > 0


def _needs_nodes(item: Resource) -> bool:
    return item["type"].startswith(CHART_PREFIX) or item["type"] in NEEDS_NODES


def check_k8s_order(plan: Plan) -> list[Violation]:
    """Kubernetes objects wait for the cluster, their Namespace, the nodes their pods need and their CRDs."""
    name = "k8s-order"
    if not _applies(name, plan):
        return []
    reach = waits_on(plan)
    clusters = {item["urn"] for item in _cluster_names(plan).values()}
    namespaces = {
        ((item["inputs"].get("metadata") or {}).get("name"), item.get("provider")): item
        for item in plan
        if item["type"] == NAMESPACE_TYPE
    }
    groups = [item for item in plan if item["type"] in NODE_GROUP_TYPES and _has_nodes_at_deploy(item)]
    charts = {_chart_name(item): item for item in plan if item["type"].startswith(CHART_PREFIX)}
    violations: list[Violation] = []
    matched = 0
    for item in plan:
        if not _is_k8s_object(item):
            continue
        matched += 1
        waits = reach(item)
        if clusters and not clusters & waits:
            violations += _violation(name, item, "does not wait for the cluster (its provider is not built from it)")
        namespace = namespaces.get((_namespace_of(item), item.get("provider")))
        if namespace is not None and namespace["urn"] not in waits:
            violations += _violation(name, item, f"does not wait for {label(namespace)}, its namespace")
        if _needs_nodes(item):
            for group in groups:
                if group["urn"] not in waits:
                    violations += _violation(name, item, f"does not wait for {label(group)}: its pods need nodes")
        group_name = item["type"].split(":")[1].split("/")[0]
        chart = charts.get(CRD_CHARTS.get(group_name, ""))
        if chart is not None and chart["urn"] not in waits:
            violations += _violation(name, item, f"does not wait for {label(chart)}, which installs its CRD")
    require_matches(name, matched, "Kubernetes object")
    return violations


CHECKS: Mapping[str, Callable[[Plan], list[Violation]]] = {
    "eks-access-order": check_eks_access_order,
    "k8s-order": check_k8s_order,
}
