"""The model's room on a GPU node: the `/models` volume sized from the model's weights, and the node disk it must fit.

The weights' size is what `python -m workload engine-plan` reports as `weights_gib` (counted from the model's
config.json, workload/contract/engine_sizing.py); the stack carries it as `job.model_weights_gib`, since the
Pulumi program never reads the model itself. The volume holds one copy of the weights, the files beside them
(tokenizer, config, shard index) and the compile caches that live next to the model (`model.cache_dir/compile/`,
workload/engine/model_source.py). A fetch stages into a folder beside the cache and renames it into place, so
one copy is what a fresh pod ever holds.

The node's disk is where the kubelet puts `emptyDir` volumes: the instance-store NVMe where the type has one
(Karpenter's `instanceStorePolicy: RAID0` and nodeadm's `localStorage: RAID0` put the kubelet's and containerd's
folders on the striped array; the small tier mounts it at boot), else the gp3 root volume. Either way the job image
shares it.
"""

from __future__ import annotations

import math

from infra.k8s.instance_types import INSTANCE_STORE_GB

GIB = 2**30
# Tokenizer, config, the shard index and safetensors headers beside the tensors the sizing counts.
WEIGHTS_HEADROOM = 1.05
# vLLM's torch.compile artifacts, inductor's and Triton's kernels for one model: a few hundred MiB to a few GiB
# (vLLM keys them by model, TP rank and compile shape); 10 GiB leaves room for a second engine shape.
COMPILE_CACHE_GIB = 10
# The embedded tiny model (no `model.source`): a few MiB of weights.
TINY_MODEL_GIB = 1
# What the node's disk holds besides the model: the job image unpacked (about 15 GB of CUDA wheels, vLLM and Ray),
# the kubelet's logs and the pods' writable layers.
IMAGE_ROOM_GIB = 40


def models_volume_gib(weights_gib: float | None) -> int:
    """The `/models` volume for a model of `weights_gib` (None: the embedded tiny model), whole GiB."""
    weights = TINY_MODEL_GIB if weights_gib is None else weights_gib * WEIGHTS_HEADROOM
    return math.ceil(weights + COMPILE_CACHE_GIB)


def models_volume(weights_gib: float | None) -> str:
    """`models_volume_gib` as the Kubernetes quantity of the emptyDir's sizeLimit."""
    return f"{models_volume_gib(weights_gib)}Gi"


def node_disk(instance_type: str, root_volume_gib: int) -> tuple[float, str]:
    """(GiB the node's disk offers the model beside the image, what that disk is) for `instance_type`."""
    store_gb = INSTANCE_STORE_GB.get(instance_type)
    if store_gb is not None:
        return store_gb * 1e9 / GIB - IMAGE_ROOM_GIB, f"its {store_gb} GB of instance-store NVMe"
    return root_volume_gib - IMAGE_ROOM_GIB, f"its {root_volume_gib} GiB gp3 root volume"


def disk_problem(weights_gib: float | None, instance_type: str, root_volume_gib: int) -> str | None:
    """Why a model of `weights_gib` cannot be kept on an `instance_type` node, or None when it can."""
    need = models_volume_gib(weights_gib)
    room, disk = node_disk(instance_type, root_volume_gib)
    if need <= room:
        return None
    weights = "the tiny model" if weights_gib is None else f"{weights_gib:g} GiB of weights"
    return (
        f"{weights} need a {need} GiB models volume (with {COMPILE_CACHE_GIB} GiB of compile caches), but "
        f"{instance_type} has {room:.0f} GiB for it on {disk} after {IMAGE_ROOM_GIB} GiB for the image"
    )
