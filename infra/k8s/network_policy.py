"""The NetworkPolicies that keep each Ray cluster's ports to that cluster.

Ray's GCS (6379), dashboard and job API (8265), client server (10001), every node's dashboard agent (52365, which
serves the job-submission API too) and raylet run code with the job's IAM role for anyone who reaches them, and
Kubernetes lets every pod reach every other by default. So every Ray pod the project runs (the nightly RayJob's
head and workers, the RayService's head and workers) is selected by two policies of its cluster:

- `ray_cluster_ingress` (on every pod of the cluster, its submitter too): the cluster's own Ray pods, on every
  port (workers use the GCS and Ray's dynamic object-manager and worker ports, the head reaches every raylet);
- `ray_head_ingress`: on the head only, the job API port from the RayJob's submitter pod and from the KubeRay
  operator's namespace (it polls the job and Serve APIs there), and for a RayService the Serve port from the
  operator too (it checks the head's proxy on `/-/healthz` before routing to it).

A cluster is told apart by `CLUSTER_LABEL`, which the renderers put on every pod of one cluster (and on its
submitter) next to the labels KubeRay adds (`ray.io/is-ray-node`, `ray.io/node-type`). KubeRay's own
`ray.io/cluster` cannot be pinned here: KubeRay names the cluster `<rayjob or rayservice>-<5 random characters>`
when it creates it, after these policies exist. Only identities that may create pods in the job namespace can
put the label on a pod: KubeRay's operator and autoscaler (docs/security.md).

Kubelet probes (KubeRay's HTTP probe on the agent's `/api/healthz` for Ray >= 2.53) come from the node's own
address, which the VPC CNI's policy agent always admits (aws-network-policy-agent, fw_rule_processor.go: "Traffic
from the local node should always be allowed"); Ray exempts that path from token authentication.

The online endpoint's head also serves HTTP on `SERVE_PORT`; `serve_ingress` admits that one port from the VPC's
own addresses (pods, nodes and an internal load balancer all have VPC addresses with the VPC CNI), and nothing
else. All of it needs the VPC CNI's network-policy enforcement (`enableNetworkPolicy` on the cluster's vpc-cni
addon, infra/components/eks_cluster.py); without it Kubernetes stores the policies and enforces nothing.
"""

from __future__ import annotations

from typing import Any

from infra.k8s.common import COMPONENT_LABEL, Manifest

# Labels KubeRay puts on every pod it creates for a RayCluster.
RAY_NODE_TYPE = "ray.io/node-type"
RAY_NODE = "ray.io/is-ray-node"
RAY_CLUSTER = "ray.io/cluster"
# Ours: which Ray cluster of the namespace a pod belongs to (the RayJob's base name, the RayService's name).
CLUSTER_LABEL = "llm-batch.io/ray-cluster"
DASHBOARD_PORT = 8265
SUBMITTER_COMPONENT = "ray-job-submitter"
NAMESPACE_NAME = "kubernetes.io/metadata.name"
# Ray Serve's HTTP proxy: the OpenAI-compatible endpoint of the RayService (KubeRay's serve Service targets it).
SERVE_PORT = 8000


def cluster_labels(cluster: str) -> dict[str, str]:
    """The label every pod of Ray cluster `cluster` carries (the renderers put it on the pod templates)."""
    return {CLUSTER_LABEL: cluster}


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _ray_pods(cluster: str) -> dict[str, str]:
    return {RAY_NODE: "yes", **cluster_labels(cluster)}


def ray_cluster_ingress(cluster: str) -> Manifest:
    """The spec of the policy on every pod of `cluster` (its Ray pods and its submitter, all of which carry the
    cluster's label on their templates): its own Ray pods, on every port."""
    return {
        "podSelector": {"matchLabels": cluster_labels(cluster)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": _ray_pods(cluster)}}]}],
    }


def ray_head_ingress(cluster: str, operator_namespace: str, *, submitter: bool, serve: bool = False) -> Manifest:
    """The spec of the policy on the head of `cluster`: the job API from its submitter (a RayJob's) and from the
    operator's namespace, plus the Serve port from the operator for a RayService (`serve`)."""
    ingress: list[dict[str, Any]] = []
    if submitter:
        peer = {"matchLabels": {COMPONENT_LABEL: SUBMITTER_COMPONENT, **cluster_labels(cluster)}}
        ingress.append({"from": [{"podSelector": peer}], "ports": _tcp(DASHBOARD_PORT)})
    operator_ports = (DASHBOARD_PORT, SERVE_PORT) if serve else (DASHBOARD_PORT,)
    ingress.append(
        {
            "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: operator_namespace}}}],
            "ports": _tcp(*operator_ports),
        }
    )
    return {
        "podSelector": {"matchLabels": {**_ray_pods(cluster), RAY_NODE_TYPE: "head"}},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }


def serve_ingress(vpc_cidr: str, pod_labels: dict[str, str]) -> Manifest:
    """The spec of the policy on the RayService's head pods (`pod_labels`): the Serve port, from the VPC only."""
    return {
        "podSelector": {"matchLabels": {RAY_NODE: "yes", RAY_NODE_TYPE: "head", **pod_labels}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"ipBlock": {"cidr": vpc_cidr}}], "ports": _tcp(SERVE_PORT)}],
    }
