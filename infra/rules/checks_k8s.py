"""Plan checks on Kubernetes objects: nothing in the cluster is reachable from the internet, and the job's
namespace enforces the `restricted` Pod Security level that every pod spec running there passes.

A Service of type LoadBalancer gets an internet-facing load balancer unless it is marked internal (the AWS
Load Balancer Controller's `aws-load-balancer-scheme: internal`, or the in-tree `aws-load-balancer-internal`);
an Ingress is internet-facing when its ALB scheme says so. Ray's dashboard and job API run code with the job's
role, so exposing them hands that role to anyone. NodePort Services are refused too: a node port is one
security-group rule away from the internet.

Pod Security: the job's namespace (the one `JobIdentity` creates) carries the admission labels that make the API
server refuse any pod below `restricted`; `pod_security_problems` states the same level for the pod specs the
project writes (RayJob head, workers, submitter, autoscaler sidecar), so a mistake is caught in the plan and in
the renderer's tests instead of at night, when the API server refuses the pod.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from infra.k8s.common import COMPONENT_LABEL, WORKER_COMPONENT
from infra.k8s.network_policy import RAY_NODE_TYPE, SERVE_PORT
from infra.rules.plan_view import CLUSTER_TIERS, Plan, Resource, Rule, Violation, label, require_matches

SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
IN_TREE_INTERNAL = "service.beta.kubernetes.io/aws-load-balancer-internal"
INGRESS_SCHEME = "alb.ingress.kubernetes.io/scheme"


def _annotations(item: Resource) -> dict[str, str]:
    metadata = item["inputs"].get("metadata") or {}
    return {str(key): str(value) for key, value in (metadata.get("annotations") or {}).items()}


def exposure_problems(item: Resource) -> list[str]:
    kind = item["type"].rsplit(":", 1)[-1]
    annotations = _annotations(item)
    if kind == "RayService" and (item["inputs"].get("spec") or {}).get("serveService"):
        # KubeRay makes this Service for the endpoint: judged as the Service it becomes.
        service = item["inputs"]["spec"]["serveService"]
        inner = {"type": "kubernetes:core/v1:Service", "inputs": service}
        return [f"spec.serveService: {problem}" for problem in exposure_problems(inner)]
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


ENFORCE = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
JOB_NAMESPACE_PARENT = "llmbatch:job_identity:JobIdentity"
# The only capability `restricted` lets a container add back.
_ALLOWED_ADDED = {"NET_BIND_SERVICE"}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def pod_specs(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod spec a manifest runs, with where it sits: a Pod's own, a workload's template, a RayJob's or
    RayCluster's head, worker groups and submitter. KubeRay's autoscaler sidecar joins the head's containers with
    the securityContext `autoscalerOptions` gives it, as KubeRay builds it."""
    kind, spec = manifest.get("kind"), manifest.get("spec") or {}
    if kind == "Pod":
        return [("spec", spec)]
    if kind in _WORKLOADS:
        return [("spec.template.spec", (spec.get("template") or {}).get("spec") or {})]
    if kind == "CronJob":
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        return [("spec.jobTemplate.spec.template.spec", (job.get("template") or {}).get("spec") or {})]
    found: list[tuple[str, dict[str, Any]]] = []
    if kind == "RayJob":
        if "submitterPodTemplate" in spec:
            found.append(("spec.submitterPodTemplate.spec", spec["submitterPodTemplate"].get("spec") or {}))
        spec, prefix = spec.get("rayClusterSpec") or {}, "spec.rayClusterSpec"
    elif kind == "RayService":
        spec, prefix = spec.get("rayClusterConfig") or {}, "spec.rayClusterConfig"
    elif kind == "RayCluster":
        prefix = "spec"
    else:
        return found
    head = dict((spec.get("headGroupSpec") or {}).get("template", {}).get("spec") or {})
    if spec.get("enableInTreeAutoscaling"):
        sidecar = {
            "name": "autoscaler",
            "securityContext": (spec.get("autoscalerOptions") or {}).get("securityContext"),
        }
        head["containers"] = [*head.get("containers", []), sidecar]
    found.append((f"{prefix}.headGroupSpec.template.spec", head))
    for index, group in enumerate(spec.get("workerGroupSpecs") or []):
        found.append(
            (f"{prefix}.workerGroupSpecs[{index}].template.spec", (group.get("template") or {}).get("spec") or {})
        )
    return found


def pod_security_problems(pod: dict[str, Any]) -> list[str]:
    """What keeps a pod spec below the `restricted` Pod Security level (Kubernetes' Pod Security Standards)."""
    problems = [f"host namespace: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    problems += [f"hostPath volume {volume.get('name')}" for volume in pod.get("volumes") or [] if "hostPath" in volume]
    pod_context = pod.get("securityContext") or {}
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        context = container.get("securityContext") or {}
        name = f"container {container.get('name')}"
        if context.get("privileged"):
            problems.append(f"{name} is privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name} does not set allowPrivilegeEscalation: false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name} does not drop ALL capabilities")
        if set(capabilities.get("add") or []) - _ALLOWED_ADDED:
            problems.append(f"{name} adds capabilities {sorted(set(capabilities['add']) - _ALLOWED_ADDED)}")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{name} may run as root (runAsNonRoot is not true)")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name} runs as user 0")
        seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name} has no RuntimeDefault seccomp profile")
    return problems


def _job_namespaces(plan: Plan) -> list[Resource]:
    return [
        item
        for item in plan
        if item.get("custom") and item["type"] == "kubernetes:core/v1:Namespace" and JOB_NAMESPACE_PARENT in item["urn"]
    ]


def check_pod_security(plan: Plan) -> list[Violation]:
    name = "pod-security"
    namespaces = _job_namespaces(plan)
    require_matches(name, len(namespaces), "job namespace")
    violations = []
    for namespace in namespaces:
        labels = (namespace["inputs"].get("metadata") or {}).get("labels") or {}
        if labels.get(ENFORCE) != "restricted" or not labels.get(ENFORCE_VERSION):
            violations.append(
                Violation(name, label(namespace), f"does not enforce {ENFORCE}: restricted with a version")
            )
    names = {(namespace["inputs"].get("metadata") or {}).get("name") for namespace in namespaces}
    for item in plan:
        metadata = item["inputs"].get("metadata") or {} if item.get("custom") else {}
        if not item["type"].startswith("kubernetes:") or metadata.get("namespace") not in names:
            continue
        manifest = {"kind": item["type"].rsplit(":", 1)[-1], "spec": item["inputs"].get("spec") or {}}
        for where, pod in pod_specs(manifest):
            violations += [
                Violation(name, label(item), f"{where}: {problem}") for problem in pod_security_problems(pod)
            ]
    return violations


BINDINGS = (
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
)


def _metadata(item: Resource) -> Mapping[str, Any]:
    return item["inputs"].get("metadata") or {}


def _binds(subject: dict[str, Any], account: str, namespace: str) -> bool:
    """Whether a (Cluster)RoleBinding subject covers `namespace/account`: by name, or through the groups every
    service account (of the namespace) belongs to."""
    if subject.get("kind") == "ServiceAccount":
        return subject.get("name") == account and subject.get("namespace", namespace) == namespace
    groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}
    return subject.get("kind") == "Group" and subject.get("name") in groups


def check_worker_identity(plan: Plan) -> list[Violation]:
    """The GPU workers' service account mounts no Kubernetes API token and no binding grants it any rights."""
    name = "worker-identity"
    namespaces = {_metadata(item).get("name") for item in _job_namespaces(plan)}
    accounts = [
        item
        for item in plan
        if item.get("custom")
        and item["type"] == "kubernetes:core/v1:ServiceAccount"
        and _metadata(item).get("namespace") in namespaces
        and (_metadata(item).get("labels") or {}).get(COMPONENT_LABEL) == WORKER_COMPONENT
    ]
    require_matches(name, len(accounts), "GPU worker service account")
    violations = [
        Violation(name, label(item), "mounts a Kubernetes API token (automountServiceAccountToken is not false)")
        for item in accounts
        if item["inputs"].get("automountServiceAccountToken") is not False
    ]
    for binding in (item for item in plan if item.get("custom") and item["type"] in BINDINGS):
        binding_namespace = _metadata(binding).get("namespace")
        for account in accounts:
            account_name, namespace = _metadata(account)["name"], _metadata(account)["namespace"]
            if binding_namespace not in (None, namespace):
                continue
            if any(_binds(subject, account_name, namespace) for subject in binding["inputs"].get("subjects") or []):
                violations.append(
                    Violation(name, label(binding), f"grants Kubernetes rights to {namespace}/{account_name}")
                )
    return violations


EKS_CLUSTER = "eks:index:Cluster"
# RFC 1918: where a VPC's addresses lie; the Serve port may be opened to a block inside them, never wider.
_PRIVATE_BLOCKS = tuple(ipaddress.IPv4Network(block) for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def _private_block(cidr: Any) -> bool:
    try:
        network = ipaddress.ip_network(str(cidr))
    except ValueError:
        return False
    return isinstance(network, ipaddress.IPv4Network) and any(network.subnet_of(block) for block in _PRIVATE_BLOCKS)


def _peer_problem(peer: dict[str, Any], serve_only: bool = False) -> str | None:
    """Why a NetworkPolicy `from` peer admits more than named pods of this namespace or a named namespace.

    A rule open on the Serve port only (`serve_only`) may also admit a private address block: the VPC, whose
    clients the endpoint is for; Ray's own ports never."""
    if "ipBlock" in peer:
        if serve_only and _private_block(peer["ipBlock"].get("cidr")) and not peer["ipBlock"].get("except"):
            return None
        return f"admits the address block {peer['ipBlock'].get('cidr')}"
    namespaces = peer.get("namespaceSelector")
    if namespaces is not None and not (namespaces.get("matchLabels") or namespaces.get("matchExpressions")):
        return "admits every namespace (empty namespaceSelector)"
    pods = peer.get("podSelector")
    if namespaces is None and not ((pods or {}).get("matchLabels") or (pods or {}).get("matchExpressions")):
        return "admits every pod of the namespace (empty podSelector)"
    return None


def ray_policy_problems(spec: dict[str, Any]) -> list[str]:
    """What lets a NetworkPolicy on the Ray head admit more than the cluster's own pods, submitter and operator."""
    if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
        return ["does not restrict ingress (policyTypes lacks Ingress)"]
    problems = []
    for index, rule in enumerate(spec.get("ingress") or []):
        peers = rule.get("from") or []
        if not peers:
            problems.append(f"ingress[{index}] has no `from`: admits every source")
        ports = rule.get("ports") or []
        serve_only = bool(ports) and all(
            port.get("port") == SERVE_PORT and port.get("protocol", "TCP") == "TCP" and "endPort" not in port
            for port in ports
        )
        problems += [
            f"ingress[{index}] {problem}" for problem in (_peer_problem(peer, serve_only) for peer in peers) if problem
        ]
    return problems


def check_ray_network_policy(plan: Plan) -> list[Violation]:
    """The VPC CNI enforces NetworkPolicy, and one in the job namespace limits who reaches Ray's head."""
    name = "ray-network-policy"
    clusters = [item for item in plan if item["type"] == EKS_CLUSTER]
    require_matches(name, len(clusters), "EKS cluster")
    violations = [
        Violation(name, label(item), "the vpc-cni addon does not enforce NetworkPolicy (enableNetworkPolicy)")
        for item in clusters
        if not _truthy((item["inputs"].get("vpcCniOptions") or {}).get("enableNetworkPolicy"))
    ]
    namespaces = {_metadata(item).get("name") for item in _job_namespaces(plan)}
    head_policies = [
        item
        for item in plan
        if item.get("custom")
        and item["type"] == NETWORK_POLICY
        and _metadata(item).get("namespace") in namespaces
        and ((item["inputs"].get("spec") or {}).get("podSelector") or {}).get("matchLabels", {}).get(RAY_NODE_TYPE)
        in ("head", None)
    ]
    if not head_policies:
        violations += [
            Violation(name, label(item), "no NetworkPolicy limits ingress to the Ray head")
            for item in _job_namespaces(plan)
        ]
    for item in head_policies:
        violations += [Violation(name, label(item), p) for p in ray_policy_problems(item["inputs"].get("spec") or {})]
    return violations


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


RULES: dict[str, Rule] = {
    "k8s-exposure": Rule(
        check_k8s_exposure,
        "use a ClusterIP Service (kubectl port-forward to reach it), or mark the load balancer internal",
        CLUSTER_TIERS,
    ),
    "pod-security": Rule(
        check_pod_security,
        "label the job namespace pod-security.kubernetes.io/enforce=restricted (+ enforce-version) and give every pod "
        "runAsNonRoot, a RuntimeDefault seccomp profile, allowPrivilegeEscalation false, capabilities drop ALL, "
        "no host namespaces or hostPath (infra/k8s/rayjob.py shows how)",
        CLUSTER_TIERS,
    ),
    "worker-identity": Rule(
        check_worker_identity,
        "keep the GPU workers' service account at automountServiceAccountToken: false with no (Cluster)RoleBinding; "
        "their S3 access comes from the IRSA token, which stays",
        CLUSTER_TIERS,
    ),
    "ray-network-policy": Rule(
        check_ray_network_policy,
        "turn on the vpc-cni addon's enableNetworkPolicy and admit to Ray's head only the cluster's Ray pods, the "
        "submitter and the KubeRay operator's namespace (infra/k8s/network_policy.py)",
        CLUSTER_TIERS,
    ),
}
