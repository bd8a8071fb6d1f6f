"""Plan check on Kubernetes objects: nothing in the cluster is reachable from the internet.

A Service of type LoadBalancer gets an internet-facing load balancer unless it is marked internal (the AWS
Load Balancer Controller's `aws-load-balancer-scheme: internal`, or the in-tree `aws-load-balancer-internal`);
an Ingress is internet-facing when its ALB scheme says so. Ray's dashboard and job API run code with the job's
role, so exposing them hands that role to anyone. NodePort Services are refused too: a node port is one
security-group rule away from the internet.
"""

from __future__ import annotations

from infra.ops.plan_view import CLUSTER_TIERS, Plan, Resource, Rule, Violation, label, require_matches

SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
IN_TREE_INTERNAL = "service.beta.kubernetes.io/aws-load-balancer-internal"
INGRESS_SCHEME = "alb.ingress.kubernetes.io/scheme"


def _annotations(item: Resource) -> dict[str, str]:
    metadata = item["inputs"].get("metadata") or {}
    return {str(key): str(value) for key, value in (metadata.get("annotations") or {}).items()}


def exposure_problems(item: Resource) -> list[str]:
    kind = item["type"].rsplit(":", 1)[-1]
    annotations = _annotations(item)
    if kind == "Service":
        service_type = (item["inputs"].get("spec") or {}).get("type", "ClusterIP")
        if service_type == "NodePort":
            return ["NodePort Service: use ClusterIP and kubectl port-forward"]
        if service_type == "LoadBalancer":
            internal = annotations.get(SCHEME) == "internal" or annotations.get(IN_TREE_INTERNAL) == "true"
            if not internal:
                return ["LoadBalancer Service without the internal scheme: an internet-facing load balancer"]
    if kind == "Ingress" and annotations.get(INGRESS_SCHEME, "internal") != "internal":
        return [f"Ingress with {INGRESS_SCHEME}: {annotations[INGRESS_SCHEME]}"]
    return []


def check_k8s_exposure(plan: Plan) -> list[Violation]:
    name = "k8s-exposure"
    objects = [item for item in plan if item.get("custom") and item["type"].startswith("kubernetes:")]
    violations = [Violation(name, label(item), problem) for item in objects for problem in exposure_problems(item)]
    require_matches(name, len(objects), "Kubernetes object")
    return violations


RULES: dict[str, Rule] = {
    "k8s-exposure": Rule(
        check_k8s_exposure,
        "use a ClusterIP Service (kubectl port-forward to reach it), or mark the load balancer internal",
        CLUSTER_TIERS,
    ),
}
