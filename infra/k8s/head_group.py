"""Everything the scheduler puts on the always-on system node and on the on-demand head nodes, and whether it fits.

Two pools of CPU nodes, so the Ray head's on-demand node runs only while a run needs it:
- the system group: one small node all month for what must answer between runs: EKS's own system pods
  (CoreDNS), the operators (KubeRay, Karpenter or the cluster autoscaler). `pods_on_system_group` lists them.
- the head pool: tainted `llm-batch.io/pool=head`, scaled from 0 (the cluster autoscaler grows the managed group,
  Karpenter its head NodePool) when a Ray head is Pending, back to 0 once the RayJob's cluster is gone. Only Ray
  heads and the RayJob's submitter tolerate the taint. `pods_on_head_group` lists them.
The GPU nodes are tainted too. A pod that does not fit stays Pending, and a Pending submitter fails the night at
its deadline. `EksConfig` (infra/config/eks.py) sums both lists and refuses a type that cannot hold them; the
components take their requests from the constants here, so the sums are of what is really asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra.k8s.common import quantity_value
from infra.k8s.instance_types import NODE_MEMORY_SHARE, InstanceShape


@dataclass(frozen=True)
class Requests:
    cpu: str
    memory: str

    def as_dict(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory}


@dataclass(frozen=True)
class HeadPod:
    """One pod (or `replicas` of them) on the head group; a DaemonSet's pod is on every head node."""

    name: str
    requests: Requests
    replicas: int = 1
    per_node: bool = False


@dataclass(frozen=True)
class RayHead:
    """One Ray cluster's head pod on the head group, and what comes with it. The nightly RayJob is one; a later
    feature that runs another Ray cluster (a RayService, say) adds its own to `EksConfig.ray_heads`."""

    name: str
    requests: Requests
    autoscaler: bool  # KubeRay's autoscaler sidecar runs in the head pod
    submitter: bool  # a RayJob in K8sJobMode runs `ray job submit` in a pod of its own


# What the project's own pods ask for (the charts' values and the RayJob render from these).
KUBERAY_OPERATOR = Requests(cpu="100m", memory="512Mi")
KARPENTER_CONTROLLER = Requests(cpu="500m", memory="1Gi")
CLUSTER_AUTOSCALER = Requests(cpu="100m", memory="300Mi")
RAY_AUTOSCALER = Requests(cpu="500m", memory="512Mi")
# `ray job submit` then following the job's logs: mostly idle. KubeRay's default submitter asks for 500m/200Mi
# with a 1 CPU / 1Gi limit, enough to leave the large tier's head node short.
RAYJOB_SUBMITTER = Requests(cpu="200m", memory="512Mi")
# The online endpoint's metrics sidecar in the RayService's head (`python -m workload.telemetry.serve_reporter`).
SERVE_REPORTER = Requests(cpu="100m", memory="256Mi")

# EKS's default add-ons (created with the cluster), at the requests EKS gives them: on every node kube-proxy and
# the VPC CNI (aws-node), neither of which sets a memory request; CoreDNS (two replicas) on the system node.
DAEMON_PODS = (
    HeadPod("kube-proxy", Requests(cpu="100m", memory="0"), per_node=True),
    HeadPod("aws-node", Requests(cpu="25m", memory="0"), per_node=True),
)
COREDNS = HeadPod("coredns", Requests(cpu="100m", memory="70Mi"), replicas=2)
SYSTEM_PODS = (COREDNS, *DAEMON_PODS)
# The system group: one node all month, and room for a second while a managed-group update replaces it.
SYSTEM_NODES = 1


def pods_on_system_group(*, karpenter: bool) -> list[HeadPod]:
    """What the always-on system node holds: EKS's system pods and the operators. Karpenter's controller (large)
    or the cluster autoscaler (medium) runs there, never both."""
    pods = [*SYSTEM_PODS, HeadPod("kuberay-operator", KUBERAY_OPERATOR)]
    if karpenter:
        pods.append(HeadPod("karpenter", KARPENTER_CONTROLLER))
    else:
        pods.append(HeadPod("cluster-autoscaler", CLUSTER_AUTOSCALER))
    return pods


def pods_on_head_group(ray_heads: Sequence[RayHead]) -> list[HeadPod]:
    """What the head pool holds while a run goes: each node's DaemonSets, each Ray head and its company."""
    pods = list(DAEMON_PODS)
    for head in ray_heads:
        cpu = quantity_value(head.requests.cpu) + (quantity_value(RAY_AUTOSCALER.cpu) if head.autoscaler else 0)
        memory = quantity_value(head.requests.memory) + (
            quantity_value(RAY_AUTOSCALER.memory) if head.autoscaler else 0
        )
        # The sidecar is a container of the head pod: one pod, which must fit one node whole.
        pods.append(
            HeadPod(f"{head.name} ray head", Requests(cpu=f"{round(cpu * 1000)}m", memory=f"{round(memory / 2**20)}Mi"))
        )
        if head.submitter:
            pods.append(HeadPod(f"{head.name} submitter", RAYJOB_SUBMITTER))
    return pods


def kube_reserved_cpu(vcpus: int) -> float:
    """CPU the EKS AMIs reserve for the kubelet and the runtime: 6% of the first core, 1% of the second, 0.5% of
    the next two and 0.25% of each core above four (the allocatable EKS reports)."""
    shares = [0.06, 0.01, 0.005, 0.005]
    return sum(shares[:vcpus]) + max(vcpus - 4, 0) * 0.0025


def allocatable(shape: InstanceShape) -> tuple[float, float]:
    """(CPUs, GiB) one node offers pods. Memory keeps the share the other fits use (kubelet reserve, eviction
    threshold and what the OS holds of the nominal size); CPU is the kubelet's reserve only, since the
    DaemonSets that also run there are counted as pods."""
    return shape.vcpus - kube_reserved_cpu(shape.vcpus), shape.memory_gib * NODE_MEMORY_SHARE


def head_group_shortfall(pods: Sequence[HeadPod], shape: InstanceShape, nodes: int) -> str | None:
    """What does not fit on `nodes` nodes of `shape`, in words; None when everything fits.

    Each pod must fit one node beside that node's DaemonSets, and all of them the group's total.
    """
    cpu_per_node, gib_per_node = allocatable(shape)
    daemons = [pod for pod in pods if pod.per_node]
    others = [pod for pod in pods if not pod.per_node]
    daemon_cpu = sum(quantity_value(pod.requests.cpu) for pod in daemons)
    daemon_gib = sum(quantity_value(pod.requests.memory) for pod in daemons) / 2**30
    room_cpu, room_gib = cpu_per_node - daemon_cpu, gib_per_node - daemon_gib
    for pod in others:
        cpu, gib = quantity_value(pod.requests.cpu), quantity_value(pod.requests.memory) / 2**30
        if cpu > room_cpu or gib > room_gib:
            return (
                f"{pod.name} ({pod.requests.cpu} CPU, {gib:.1f} GiB) fits no head node ({room_cpu:.3f} CPU, "
                f"{room_gib:.1f} GiB left beside the DaemonSets)"
            )
    need_cpu = sum(quantity_value(pod.requests.cpu) * pod.replicas for pod in others)
    need_gib = sum(quantity_value(pod.requests.memory) * pod.replicas for pod in others) / 2**30
    if need_cpu > room_cpu * nodes or need_gib > room_gib * nodes:
        listed = ", ".join(
            f"{pod.name} {pod.requests.cpu}" + (f" x{pod.replicas}" * (pod.replicas > 1)) for pod in others
        )
        return (
            f"the head group's pods ask for {need_cpu:.3f} CPU and {need_gib:.1f} GiB, but {nodes} node(s) hold "
            f"{room_cpu * nodes:.3f} CPU and {room_gib * nodes:.1f} GiB beside the DaemonSets ({listed})"
        )
    return None
