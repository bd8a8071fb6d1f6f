"""The large tier's GPU worker groups, and which one runs the night.

Karpenter's tier has two: one-GPU workers (`eks.node_pool`, `eks.worker_size`: g5.xlarge, g5.2xlarge) and
eight-GPU workers (`eks.eight_gpu`: p4d.24xlarge, g5.48xlarge; p5.48xlarge where the region offers it,
infra/config/regional_types.py), each with its Spot NodePool, its on-demand fallback and its KubeRay worker group.
The stack's model picks one through what `python -m workload engine-plan` prints for it: an engine of
`tensor_parallel_size` 1 runs on the one-GPU group, a larger one on the eight-GPU group (`8 / tensor_parallel_size`
engines a node); the weights (`job.model_weights_gib`) must fit the group's smallest GPU at that size. The model's
config.json, where it is on this machine, is checked against every type of the chosen group by
`infra/ops/checks_engine_fit.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.k8s.instance_types import shape_of
from infra.k8s.karpenter import NodePoolArgs
from infra.k8s.rayjob import PodSize
from workload.contract.engine_sizing import gpu_kind, kind_of_instance

if TYPE_CHECKING:
    from infra.config.eks import EksConfig

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class WorkerGroup:
    """One GPU worker shape: its pools (Spot and fallback), its pod and how many of them."""

    key: str  # the config keys it comes from, for messages
    node_pool: NodePoolArgs
    size: PodSize
    max_nodes: int
    min_workers: int

    @property
    def name(self) -> str:
        """The KubeRay worker group's name: the pool label its pods select."""
        return self.node_pool.pool

    def engines_per_node(self, tensor_parallel_size: int) -> int:
        return self.size.gpus // tensor_parallel_size

    def describe(self, tensor_parallel_size: int) -> str:
        engines = self.engines_per_node(tensor_parallel_size)
        return (
            f"worker group {self.name} ({self.key}): {', '.join(self.node_pool.instance_types)}; "
            f"tensor_parallel_size {tensor_parallel_size}, {engines} engine(s) per node, up to {self.max_nodes} "
            f"node(s) ({engines * self.max_nodes} engines)"
        )


def worker_groups(eks: EksConfig) -> list[WorkerGroup]:
    """The GPU worker groups of an EKS stack, smallest first (medium's managed group counts as one-GPU)."""
    if not eks.karpenter_enabled:
        # The medium tier's managed group, seen as a pool of its one type (never rendered as a NodePool).
        pool = NodePoolArgs(instance_types=[eks.gpu_instance_type])
        return [WorkerGroup("eks.gpu_instance_type", pool, eks.worker_size, eks.gpu_max_nodes, eks.gpu_max_nodes)]
    one = WorkerGroup("eks.node_pool", eks.node_pool, eks.worker_size, eks.gpu_max_nodes, eks.gpu_min_workers)
    if not eks.eight_gpu.enabled:
        return [one]
    wide = eks.eight_gpu
    return [one, WorkerGroup("eks.eight_gpu", wide.node_pool, wide.worker_size, wide.max_nodes, 1)]


def smallest_gpu_gib(group: WorkerGroup, memory_utilization: float) -> tuple[str, float]:
    """(GPU kind, GiB vLLM may use on one of its GPUs) for the group's type with the least GPU memory."""
    kinds = {kind_of_instance(t) or "" for t in group.node_pool.instance_types}
    known = [(gpu_kind(k).cuda_total_mib, k) for k in kinds if k]
    if not known:
        raise ValueError(f"{group.key}: no GPU kind of workload/contract/gpu_kinds.json lists its instance types")
    mib, kind = min(known)
    return kind, mib / MIB_PER_GIB * memory_utilization


def choose_group(
    groups: list[WorkerGroup], tensor_parallel_size: int, weights_gib: float | None, memory_utilization: float
) -> WorkerGroup:
    """The group the night runs on: the first whose workers hold whole engines of `tensor_parallel_size` GPUs
    (one-GPU workers for 1, eight-GPU workers for 2, 4 or 8), refused with the fix when the weights cannot fit the
    group's smallest GPUs at that size."""
    fitting = [g for g in groups if g.size.gpus >= tensor_parallel_size and g.size.gpus % tensor_parallel_size == 0]
    if not fitting:
        most = max(g.size.gpus for g in groups)
        raise ValueError(
            f"job.job_overrides.engine.tensor_parallel_size ({tensor_parallel_size}) fits no worker group "
            f"(GPUs a worker: {', '.join(str(g.size.gpus) for g in groups)}): use a divisor of {most}, as "
            "`python -m workload engine-plan --gpus 8` prints"
        )
    group = fitting[0]
    if weights_gib is not None:
        kind, per_gpu = smallest_gpu_gib(group, memory_utilization)
        if weights_gib / tensor_parallel_size >= per_gpu:
            need = next((tp for tp in (2, 4, 8) if weights_gib / tp < per_gpu), None)
            fix = (
                f"set job.job_overrides.engine.tensor_parallel_size to {need} (the eight-GPU workers), as "
                f"`python -m workload engine-plan --model <source> --gpu {kind} --gpus 8` prints"
                if need
                else "the model does not fit even 8 of these GPUs; quantise it or list larger GPUs"
            )
            raise ValueError(
                f"job.model_weights_gib ({weights_gib:g}) over tensor_parallel_size {tensor_parallel_size} is "
                f"{weights_gib / tensor_parallel_size:.1f} GiB a GPU, more than the {per_gpu:.1f} GiB vLLM may use "
                f"of one {kind} of {group.key} ({shape_of(group.node_pool.instance_types[0]).gpus} GPU(s) a node): "
                f"{fix}"
            )
    return group


def gpu_node_pool_names(eks: EksConfig) -> list[str]:
    """Karpenter's GPU NodePools of the night, each Spot pool and its on-demand fallback (the endpoint's pool is
    not the night's): what the nightly release empties."""
    pools = [eks.node_pool, *([eks.eight_gpu.node_pool] if eks.eight_gpu.enabled else [])]
    return [each.name for pool in pools for each in pool.spot_and_fallback()]
