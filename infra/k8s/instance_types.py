"""The few EC2 instance types the EKS tiers use, with the sizes scheduling decisions depend on.

Only shapes live here (fixed by AWS per type); prices change and are looked up, never written down.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceShape:
    vcpus: int
    memory_gib: int
    gpus: int


SHAPES: dict[str, InstanceShape] = {
    "t3.medium": InstanceShape(vcpus=2, memory_gib=4, gpus=0),
    "m5.large": InstanceShape(vcpus=2, memory_gib=8, gpus=0),
    "m5.xlarge": InstanceShape(vcpus=4, memory_gib=16, gpus=0),
    "m5.2xlarge": InstanceShape(vcpus=8, memory_gib=32, gpus=0),
    "g5.xlarge": InstanceShape(vcpus=4, memory_gib=16, gpus=1),
    "g5.2xlarge": InstanceShape(vcpus=8, memory_gib=32, gpus=1),
    "g5.4xlarge": InstanceShape(vcpus=16, memory_gib=64, gpus=1),
    "g5.12xlarge": InstanceShape(vcpus=48, memory_gib=192, gpus=4),
    "g5.48xlarge": InstanceShape(vcpus=192, memory_gib=768, gpus=8),
    "g6.xlarge": InstanceShape(vcpus=4, memory_gib=16, gpus=1),
    "g6.2xlarge": InstanceShape(vcpus=8, memory_gib=32, gpus=1),
    "p4d.24xlarge": InstanceShape(vcpus=96, memory_gib=1152, gpus=8),
    "p5.48xlarge": InstanceShape(vcpus=192, memory_gib=2048, gpus=8),
}


# NVMe instance store per type, in GB (EC2's instance-type pages, "Instance storage"; fixed per type). With
# Karpenter's `instanceStorePolicy: RAID0` (infra/k8s/karpenter.py) and the small tier's boot script it holds the
# node's model cache; tests/infra/test_k8s_karpenter.py checks every GPU type the stacks launch has room for it.
INSTANCE_STORE_GB: dict[str, int] = {
    "g5.xlarge": 250,
    "g5.2xlarge": 450,
    "g5.4xlarge": 600,
    "g5.12xlarge": 3800,
    "g5.48xlarge": 7600,
    "g6.xlarge": 250,
    "g6.2xlarge": 450,
    "p4d.24xlarge": 8000,
    "p5.48xlarge": 30720,  # 8 x 3.84 TB
}


# Room a node keeps for the kubelet, the OS and its daemons (VPC CNI, kube-proxy, device plugin).
NODE_RESERVED_CPU = 0.5
NODE_MEMORY_SHARE = 0.85


def shape_of(instance_type: str) -> InstanceShape:
    """The shape of a known instance type; a ValueError listing the known ones otherwise."""
    try:
        return SHAPES[instance_type]
    except KeyError:
        known = ", ".join(sorted(SHAPES))
        raise ValueError(f"unknown instance type {instance_type!r}; known: {known}") from None
