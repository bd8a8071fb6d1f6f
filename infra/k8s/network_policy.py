"""The NetworkPolicy that keeps Ray's head to its own cluster.

Ray's GCS (6379), dashboard and job API (8265), client server (10001) and the dashboard agent run code with the
job's IAM role for anyone who reaches them, and Kubernetes lets every pod reach every other by default. This
policy admits to the head only the Ray pods of the job's namespace (all ports: workers use GCS and Ray's
dynamic object-manager ports), the RayJob submitter (the job API) and the KubeRay operator's namespace (which
polls the job API). It needs the VPC CNI's network-policy enforcement (`enableNetworkPolicy` on the cluster's
vpc-cni addon, infra/components/eks_cluster.py); without it Kubernetes stores the policy and enforces nothing.

The online endpoint's RayService head also serves HTTP on `SERVE_PORT`; `serve_ingress` admits that one port
from the VPC's own addresses (pods, nodes and an internal load balancer all have VPC addresses with the VPC CNI),
and nothing else: the Ray ports stay behind the policy above.
"""

from __future__ import annotations

from typing import Any

from infra.k8s.common import COMPONENT_LABEL, Manifest

# Labels KubeRay puts on every pod it creates for a RayCluster.
RAY_NODE_TYPE = "ray.io/node-type"
RAY_NODE = "ray.io/is-ray-node"
DASHBOARD_PORT = 8265
SUBMITTER_COMPONENT = "ray-job-submitter"
NAMESPACE_NAME = "kubernetes.io/metadata.name"
# Ray Serve's HTTP proxy: the OpenAI-compatible endpoint of the RayService (KubeRay's serve Service targets it).
SERVE_PORT = 8000


def ray_head_ingress(namespace: str, operator_namespace: str) -> Manifest:
    """The spec of the policy on the Ray head pods of `namespace`."""
    job_api: list[dict[str, Any]] = [{"protocol": "TCP", "port": DASHBOARD_PORT}]
    return {
        "podSelector": {"matchLabels": {RAY_NODE_TYPE: "head"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {RAY_NODE: "yes"}}}]},
            {"from": [{"podSelector": {"matchLabels": {COMPONENT_LABEL: SUBMITTER_COMPONENT}}}], "ports": job_api},
            {
                "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: operator_namespace}}}],
                "ports": job_api,
            },
        ],
    }


def serve_ingress(vpc_cidr: str, pod_labels: dict[str, str]) -> Manifest:
    """The spec of the policy on the RayService's head pods (`pod_labels`): the Serve port, from the VPC only."""
    return {
        "podSelector": {"matchLabels": {RAY_NODE_TYPE: "head", **pod_labels}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"ipBlock": {"cidr": vpc_cidr}}], "ports": [{"protocol": "TCP", "port": SERVE_PORT}]}],
    }
