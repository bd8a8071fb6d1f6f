"""Plan checks on Ray's own doors: no pod outside a Ray cluster reaches its ports, and Ray asks for its token.

`ray-isolation` reads every Ray cluster the stack runs: the RayService, RayCluster and RayJob resources of the
plan and the RayJob each night submits (rendered from the `rayjob_args` export as the nightly submitter renders
it, `infra.rules.k8s_manifests.night_objects`). For each of its pods (head and every worker group) it takes the
labels the pod will carry (the template's plus KubeRay's: `ray.io/is-ray-node`, `ray.io/node-type`,
`ray.io/group`, `ray.io/cluster`) and requires:

- a NetworkPolicy of the pod's namespace that selects it, restricting ingress;
- that every policy selecting it admits only the pod's own Ray cluster (peers pinning the pod's
  `llm-batch.io/ray-cluster` label, on any port if they are Ray pods, on the job API if not: the submitter), the
  KubeRay operator's namespace on the job API and Serve ports, and private address blocks (the VPC's clients) on
  the Serve port only. Another namespace, every namespace, an address block on Ray's ports, a peer of another
  cluster or a rule without `from` is refused;
- token authentication: `authOptions.mode: token` in the cluster spec, a Ray version that has it, no container
  setting Ray's auth variables itself (KubeRay keeps a variable a container already sets, so one line would turn
  the token off or put it in the manifest), and a KubeRay operator chart that reads `authOptions` at all.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from infra.components.kuberay import OPERATOR_NAMESPACE
from infra.k8s.common import Manifest
from infra.k8s.network_policy import (
    CLUSTER_LABEL,
    DASHBOARD_PORT,
    NAMESPACE_NAME,
    RAY_CLUSTER,
    RAY_NODE,
    RAY_NODE_TYPE,
    SERVE_PORT,
)
from infra.k8s.ray_auth import AUTH_ENV, MIN_KUBERAY, MIN_RAY, version_tuple
from infra.rules.k8s_manifests import night_objects, pod_templates
from infra.rules.plan_view import CLUSTER_TIERS, Plan, Resource, Rule, Violation, label, require_matches

NAME = "ray-isolation"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
CHART = "kubernetes:helm.sh/v4:Chart"
RAY_KINDS = ("RayJob", "RayService", "RayCluster")
# RFC 1918: where a VPC's addresses lie; the Serve port may be opened to a block inside them, never wider.
_PRIVATE = tuple(ipaddress.IPv4Network(block) for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def cluster_spec(manifest: Manifest) -> dict[str, Any]:
    spec = manifest.get("spec") or {}
    kind = manifest.get("kind")
    if kind == "RayJob":
        return dict(spec.get("rayClusterSpec") or {})
    if kind == "RayService":
        return dict(spec.get("rayClusterConfig") or {})
    return dict(spec)


def ray_pods(manifest: Manifest) -> list[tuple[str, dict[str, str]]]:
    """(group, labels) of each pod group of a Ray cluster, with the labels KubeRay adds to the template's."""
    spec, name = cluster_spec(manifest), (manifest.get("metadata") or {}).get("name", "unnamed")
    groups = [("head", "headgroup", spec.get("headGroupSpec") or {})]
    groups += [("worker", g.get("groupName", ""), g) for g in spec.get("workerGroupSpecs") or []]
    found = []
    for node_type, group, group_spec in groups:
        labels = {
            str(k): str(v)
            for k, v in (((group_spec.get("template") or {}).get("metadata") or {}).get("labels") or {}).items()
        }
        labels.update({RAY_NODE: "yes", RAY_NODE_TYPE: node_type, "ray.io/group": group, RAY_CLUSTER: f"{name}-xxxxx"})
        found.append((f"{node_type} group {group}", labels))
    return found


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector matches `labels` (an empty selector matches everything)."""
    selector = selector or {}
    if any(labels.get(key) != str(value) for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if (operator == "Exists") != present and operator in ("Exists", "DoesNotExist"):
            return False
    return True


def _private(peer: dict[str, Any]) -> bool:
    block = peer.get("ipBlock") or {}
    try:
        network = ipaddress.ip_network(str(block.get("cidr")))
    except ValueError:
        return False
    return isinstance(network, ipaddress.IPv4Network) and any(network.subnet_of(b) for b in _PRIVATE)


def peer_problem(peer: dict[str, Any], ports: list[dict[str, Any]], pod_labels: dict[str, str]) -> str | None:
    """Why an ingress peer (on `ports`; none: every port) reaches a Ray pod beyond what its cluster needs."""
    numbers = {port.get("port") for port in ports}
    bounded = bool(ports) and not any("endPort" in port for port in ports)
    on = f"on ports {sorted(numbers, key=str)}" if ports else "on every port"
    if "ipBlock" in peer:
        if bounded and numbers <= {SERVE_PORT} and _private(peer) and not peer["ipBlock"].get("except"):
            return None
        return f"admits the address block {peer['ipBlock'].get('cidr')} {on}"
    namespaces = peer.get("namespaceSelector")
    if namespaces is not None:
        operator = namespaces == {"matchLabels": {NAMESPACE_NAME: OPERATOR_NAMESPACE}}
        if operator and bounded and numbers <= {DASHBOARD_PORT, SERVE_PORT}:
            return None
        which = (namespaces.get("matchLabels") or {}).get(NAMESPACE_NAME) or namespaces or "every namespace"
        return f"admits other namespaces ({which}) {on}"
    pinned = (peer.get("podSelector") or {}).get("matchLabels") or {}
    cluster = pod_labels.get(CLUSTER_LABEL)
    if not cluster or pinned.get(CLUSTER_LABEL) != cluster:
        return f"admits pods beyond its own Ray cluster (the peer does not pin {CLUSTER_LABEL}={cluster}) {on}"
    if pinned.get(RAY_NODE) == "yes" or (bounded and numbers <= {DASHBOARD_PORT}):
        return None
    return f"admits pods of its cluster that are not Ray's {on} (only the job API is theirs)"


def policy_problems(spec: dict[str, Any], pod_labels: dict[str, str]) -> list[str]:
    problems = []
    for index, rule in enumerate(spec.get("ingress") or []):
        peers, ports = rule.get("from") or [], rule.get("ports") or []
        if not peers:
            problems.append(f"ingress[{index}] has no `from`: admits every source")
        problems += [f"ingress[{index}] {p}" for p in (peer_problem(peer, ports, pod_labels) for peer in peers) if p]
    return problems


def auth_problems(manifest: Manifest) -> list[str]:
    """What leaves a Ray cluster's token authentication off, or its token outside KubeRay's Secret."""
    spec = cluster_spec(manifest)
    auth = spec.get("authOptions") or {}
    problems = []
    if auth.get("mode") != "token":
        problems.append("Ray's token authentication is off (authOptions.mode is not 'token')")
    if auth.get("enableK8sTokenAuth"):
        problems.append("authOptions.enableK8sTokenAuth: KubeRay refuses it for RayJob and RayService")
    try:
        if version_tuple(str(spec.get("rayVersion", "0"))) < MIN_RAY:
            problems.append(f"rayVersion {spec.get('rayVersion')} has no token authentication (needs 2.52)")
    except ValueError:
        problems.append(f"rayVersion {spec.get('rayVersion')!r} is not a version")
    containers = [("autoscalerOptions", spec.get("autoscalerOptions") or {})]
    for path, template in pod_templates(manifest):
        pod = template.get("spec") or {}
        containers += [(f"{path} {c.get('name')}", c) for c in [*pod.get("initContainers", []), *pod["containers"]]]
    for where, container in containers:
        for env in container.get("env") or []:
            if env.get("name") in AUTH_ENV:
                literal = " as a literal in the manifest" if "value" in env else ""
                problems.append(f"{where} sets {env['name']}{literal}: KubeRay's own setting (from its Secret) loses")
    return problems


def ray_clusters(plan: Plan) -> list[tuple[str, Manifest]]:
    found = [
        (label(item), {**dict(item["inputs"]), "kind": item["type"].rsplit(":", 1)[-1]})
        for item in plan
        if item.get("custom") and item["type"].startswith("kubernetes:ray.io/") and item["type"].endswith(RAY_KINDS)
    ]
    found += [
        (f"RayJob {obj['metadata']['name']} (each night's, from rayjob_args)", obj)
        for obj in night_objects(plan)
        if obj.get("kind") in RAY_KINDS
    ]
    return found


def _operator_problems(plan: Plan) -> list[Violation]:
    charts = [item for item in plan if item["type"] == CHART and item["inputs"].get("chart") == "kuberay-operator"]
    require_matches(NAME, len(charts), "KubeRay operator chart")
    violations = []
    for chart in charts:
        version = str(chart["inputs"].get("version", "0"))
        if version_tuple(version) < MIN_KUBERAY:
            violations.append(
                Violation(NAME, label(chart), f"KubeRay {version} ignores authOptions (token auth needs 1.5.1)")
            )
    return violations


def check_ray_isolation(plan: Plan) -> list[Violation]:
    clusters = ray_clusters(plan)
    require_matches(NAME, len(clusters), "Ray cluster (RayJob, RayService or RayCluster)")
    policies: list[Resource] = [item for item in plan if item.get("custom") and item["type"] == NETWORK_POLICY]
    violations = _operator_problems(plan)
    reported: set[tuple[str, str]] = set()
    for where, manifest in clusters:
        violations += [Violation(NAME, where, problem) for problem in auth_problems(manifest)]
        namespace = (manifest.get("metadata") or {}).get("namespace")
        for group, labels in ray_pods(manifest):
            covering = [
                item
                for item in policies
                if (item["inputs"].get("metadata") or {}).get("namespace") == namespace
                and "Ingress" in ((item["inputs"].get("spec") or {}).get("policyTypes") or ["Ingress"])
                and selects((item["inputs"].get("spec") or {}).get("podSelector"), labels)
            ]
            if not covering:
                violations.append(Violation(NAME, where, f"{group}: no NetworkPolicy limits ingress to its pods"))
            for item in covering:
                for problem in policy_problems(item["inputs"].get("spec") or {}, labels):
                    if (label(item), problem) not in reported:
                        reported.add((label(item), problem))
                        violations.append(Violation(NAME, label(item), f"on the {group} of {where}: {problem}"))
    return violations


RULES: dict[str, Rule] = {
    NAME: Rule(
        check_ray_isolation,
        "give every Ray pod its cluster's NetworkPolicies (infra/k8s/network_policy.py: its own Ray pods, the "
        "submitter and the operator on the job API, the VPC on the Serve port only), keep authOptions.mode: token "
        "with a KubeRay chart >= 1.5.1, and leave RAY_AUTH_* to KubeRay (infra/k8s/ray_auth.py)",
        CLUSTER_TIERS,
    ),
}
