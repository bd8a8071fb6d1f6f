"""Issue 34: no pod in the cluster runs code as the job. Every Ray pod of the medium and large plans (serving off
and on) is selected by its cluster's NetworkPolicies, which admit only what the cluster needs; every Ray cluster
asks KubeRay for token authentication; the manifests match KubeRay's CRDs (tests/infra/data/crds, KubeRay 1.7.0's).

Reachability is worked out here from the plan's own NetworkPolicy objects with Kubernetes' semantics (a pod
selected by some ingress policy admits the union of their rules; peers in a rule without a namespaceSelector are
the policy's namespace), for sources a pod in the cluster can be: no cluster runs here, so this is the policies'
meaning, not a packet test (docs/security.md says what a live check would add).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infra import versions
from infra.components.kuberay import OPERATOR_NAMESPACE
from infra.k8s.network_policy import CLUSTER_LABEL, DASHBOARD_PORT, SERVE_PORT, SUBMITTER_COMPONENT
from infra.k8s.ray_auth import MIN_KUBERAY, version_tuple
from infra.rules import checks_ray
from infra.rules.k8s_manifests import night_objects
from tests.infra.conftest import Plan
from tests.infra.crd_schema import assert_valid

GCS, CLIENT, AGENT = 6379, 10001, 52365
RAY_PORTS = (GCS, DASHBOARD_PORT, CLIENT, AGENT)
NAMESPACE = "llm-batch"
NIGHTLY, SERVING = "llm-batch", "llm-batch-serve"


@dataclass(frozen=True)
class Source:
    """Who opens a connection: a pod (labels, namespace) or a bare address (node, load balancer)."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = NAMESPACE
    ip: str = "10.40.12.7"  # pods, nodes and internal load balancers all have VPC addresses with the VPC CNI


def _ray_pod(cluster: str, node_type: str) -> Source:
    labels = {"ray.io/is-ray-node": "yes", "ray.io/node-type": node_type, CLUSTER_LABEL: cluster}
    return Source(f"{cluster} {node_type}", labels)


SOURCES = {
    "nightly worker": _ray_pod(NIGHTLY, "worker"),
    "serving worker": _ray_pod(SERVING, "worker"),
    "nightly submitter": Source(
        "submitter", {"app.kubernetes.io/component": SUBMITTER_COMPONENT, CLUSTER_LABEL: NIGHTLY}
    ),
    "operator": Source("operator", {"app.kubernetes.io/name": "kuberay-operator"}, OPERATOR_NAMESPACE),
    "other pod of the job namespace": Source("debug", {"app": "debug"}),
    "pod of another namespace": Source("stranger", {"app": "x"}, "default"),
}


def _peer_admits(peer: dict[str, Any], source: Source, namespace: str) -> bool:
    if "ipBlock" in peer:
        return ipaddress.ip_address(source.ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if source.namespace is None:
        return False
    namespaces = peer.get("namespaceSelector")
    if namespaces is None:
        in_namespace = source.namespace == namespace
    else:
        in_namespace = checks_ray.selects(namespaces, {"kubernetes.io/metadata.name": source.namespace})
    return in_namespace and checks_ray.selects(peer.get("podSelector"), source.labels)


def admits(plan: Plan, pod_labels: dict[str, str], source: Source, port: int) -> bool:
    """Whether the plan's NetworkPolicies let `source` reach a pod with `pod_labels` in the job namespace on `port`."""
    selecting = [
        item["inputs"]["spec"]
        for item in plan
        if item["type"] == checks_ray.NETWORK_POLICY
        and item["inputs"]["metadata"]["namespace"] == NAMESPACE
        and checks_ray.selects(item["inputs"]["spec"]["podSelector"], pod_labels)
    ]
    assert selecting, f"no policy selects {pod_labels}: Kubernetes would admit everyone"
    return any(
        any(_peer_admits(peer, source, NAMESPACE) for peer in rule.get("from") or [])
        and (not rule.get("ports") or any(p["port"] == port for p in rule["ports"]))
        for spec in selecting
        for rule in spec.get("ingress") or []
    )


def _pods(plan: Plan) -> dict[str, dict[str, str]]:
    """'<cluster> <head|worker>' -> the labels KubeRay's pod will carry, for every Ray cluster of the plan."""
    found = {}
    for _, manifest in checks_ray.ray_clusters(plan):
        for group, labels in checks_ray.ray_pods(manifest):
            found[f"{labels[CLUSTER_LABEL]} {group.split()[0]}"] = labels
    return found


def _plans() -> list[tuple[str, bool]]:
    return [(tier, serving) for tier in ("medium", "large") for serving in (False, True)]


@pytest.fixture
def plan_of(plan_for: Callable[[str], Plan], serve_plan: Callable[[str], Plan]) -> Callable[[str, bool], Plan]:
    return lambda tier, serving: serve_plan(tier) if serving else plan_for(tier)


@pytest.mark.parametrize(("tier", "serving"), _plans())
def test_each_ray_pod_admits_only_its_own_cluster_the_submitter_and_the_operator(
    plan_of: Callable[[str, bool], Plan], tier: str, serving: bool
) -> None:
    plan = plan_of(tier, serving)
    assert checks_ray.check_ray_isolation(plan) == []
    pods = _pods(plan)
    assert set(pods) == {f"{NIGHTLY} head", f"{NIGHTLY} worker"} | (
        {f"{SERVING} head", f"{SERVING} worker"} if serving else set()
    )
    for name, labels in pods.items():
        cluster, node_type = name.rsplit(" ", 1)
        own = _ray_pod(cluster, "worker")
        assert all(admits(plan, labels, own, port) for port in RAY_PORTS), f"{name} shuts out its own cluster"
        for who in ("serving worker", "nightly worker"):
            if SOURCES[who] != own:
                assert not any(admits(plan, labels, SOURCES[who], port) for port in RAY_PORTS), f"{who} -> {name}"
        for who in ("other pod of the job namespace", "pod of another namespace"):
            assert not any(admits(plan, labels, SOURCES[who], port) for port in RAY_PORTS), f"{who} -> {name}"
        # The operator: the job and Serve APIs of heads only.
        operator = SOURCES["operator"]
        assert admits(plan, labels, operator, DASHBOARD_PORT) is (node_type == "head")
        assert not any(admits(plan, labels, operator, port) for port in (GCS, CLIENT, AGENT))
        # The submitter: the nightly head's job API, nothing else.
        submitter = SOURCES["nightly submitter"]
        expected = name == f"{NIGHTLY} head"
        assert admits(plan, labels, submitter, DASHBOARD_PORT) is expected
        assert not any(admits(plan, labels, submitter, port) for port in (GCS, CLIENT, AGENT))
        # The Serve port: the endpoint's head only, for any VPC address (its clients) and the operator's probe.
        serve_head = name == f"{SERVING} head"
        assert admits(plan, labels, SOURCES["pod of another namespace"], SERVE_PORT) is serve_head
        assert admits(plan, labels, operator, SERVE_PORT) is serve_head


@pytest.mark.parametrize(("tier", "serving"), _plans())
def test_every_ray_cluster_asks_for_token_auth_and_matches_kuberay_s_crds(
    plan_of: Callable[[str, bool], Plan], tier: str, serving: bool, crds_dir: Path
) -> None:
    plan = plan_of(tier, serving)
    clusters = checks_ray.ray_clusters(plan)
    assert [m["kind"] for _, m in clusters] == (["RayService"] if serving else []) + ["RayJob"]
    for _, manifest in clusters:
        assert checks_ray.cluster_spec(manifest)["authOptions"] == {"mode": "token"}
        assert checks_ray.auth_problems(manifest) == []
        text = json.dumps(manifest)
        assert "RAY_AUTH" not in text  # KubeRay sets the variables, from its own Secret
        crd = {key: manifest[key] for key in ("apiVersion", "kind", "metadata", "spec")}
        assert_valid(crd, crds_dir)
    (chart,) = [i for i in plan if i["type"] == checks_ray.CHART and i["inputs"]["chart"] == "kuberay-operator"]
    assert version_tuple(chart["inputs"]["version"]) >= MIN_KUBERAY
    assert chart["inputs"]["version"] == versions.HELM_CHARTS["kuberay-operator"][1]


def test_the_night_template_the_submitter_sends_carries_the_token_option_and_the_cluster_label(
    plan_for: Callable[[str], Plan],
) -> None:
    """The nightly Lambda (infra/functions/submit_rayjob) only posts the template: the token and the labels the
    policies select must be in it, and every night's RayJob must keep the base cluster label."""
    (night,) = [obj for obj in night_objects(plan_for("medium")) if obj["kind"] == "RayJob"]
    spec = night["spec"]
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    templates = [
        spec["submitterPodTemplate"],
        spec["rayClusterSpec"]["headGroupSpec"]["template"],
        *(group["template"] for group in spec["rayClusterSpec"]["workerGroupSpecs"]),
    ]
    assert {template["metadata"]["labels"][CLUSTER_LABEL] for template in templates} == {NIGHTLY}
    assert night["metadata"]["name"] != NIGHTLY  # a night's own name, the base's cluster label


@pytest.mark.parametrize(
    ("peer", "ports", "problem"),
    [
        ({"namespaceSelector": {}}, [], "admits other namespaces (every namespace) on every port"),
        (
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}}},
            [{"port": GCS}],
            "admits other namespaces (kuberay-system) on ports [6379]",
        ),
        (
            {"ipBlock": {"cidr": "10.0.0.0/8"}},
            [{"port": AGENT}],
            "admits the address block 10.0.0.0/8 on ports [52365]",
        ),
        ({"ipBlock": {"cidr": "0.0.0.0/0"}}, [{"port": SERVE_PORT}], "admits the address block 0.0.0.0/0 on ports"),
        ({"podSelector": {}}, [], "admits pods beyond its own Ray cluster"),
        ({"podSelector": {"matchLabels": {CLUSTER_LABEL: SERVING}}}, [], "admits pods beyond its own Ray cluster"),
        ({"podSelector": {"matchLabels": {CLUSTER_LABEL: NIGHTLY}}}, [{"port": GCS}], "that are not Ray's"),
    ],
)
def test_the_rule_names_each_way_a_peer_reaches_too_far(peer: dict[str, Any], ports: list[Any], problem: str) -> None:
    labels = {CLUSTER_LABEL: NIGHTLY, "ray.io/is-ray-node": "yes"}
    assert problem in (checks_ray.peer_problem(peer, ports, labels) or "")


def test_the_rule_refuses_a_token_in_the_manifest_and_auth_switched_off() -> None:
    worker = {"name": "ray-worker", "env": [{"name": "RAY_AUTH_TOKEN", "value": "hunter2"}]}
    manifest = {
        "kind": "RayCluster",
        "metadata": {"name": "c"},
        "spec": {
            "rayVersion": "2.51.0",
            "authOptions": {"mode": "disabled"},
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
            "workerGroupSpecs": [{"groupName": "gpu", "template": {"spec": {"containers": [worker]}}}],
        },
    }
    problems = checks_ray.auth_problems(manifest)
    assert problems[0] == "Ray's token authentication is off (authOptions.mode is not 'token')"
    assert "rayVersion 2.51.0 has no token authentication (needs 2.52)" in problems
    assert any("sets RAY_AUTH_TOKEN as a literal in the manifest" in p for p in problems)
