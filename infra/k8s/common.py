"""Names, labels, taints and quantities shared by every manifest the project renders."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.versions import KUBERNETES_VERSION

# A manifest is the plain dict `kubectl apply` would take.
Manifest = dict[str, Any]

APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "llm-batch"
PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
# The component of the GPU workers' pods and of their service account (which the plan's rules look for).
WORKER_COMPONENT = "ray-worker"

# One label marks which pool a node belongs to, whether a managed node group or Karpenter made it, so a pod's
# nodeSelector reads the same in the medium and the large tier.
POOL_LABEL = "llm-batch.io/pool"
HEAD_POOL = "head"
GPU_POOL = "gpu"
# The large tier's eight-GPU nodes (p4d.24xlarge, g5.48xlarge, p5.48xlarge where offered): their own pool, so a
# one-GPU worker never lands on one and an eight-GPU worker never waits for a g5.xlarge.
GPU8_POOL = "gpu8"
# The always-on node of CoreDNS and the operators; the head pool scales from 0 between runs.
SYSTEM_POOL = "system"
# Head nodes carry this taint (key POOL_LABEL, value HEAD_POOL), so only Ray heads and the RayJob's submitter land
# there: a CoreDNS or operator pod on a head node would keep it from scaling back to 0.
HEAD_TAINT_EFFECT = "NoSchedule"

# GPU nodes carry this taint so only pods that ask for a GPU (and tolerate it) land there; the NVIDIA device
# plugin's chart tolerates it by default.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
GPU_RESOURCE = "nvidia.com/gpu"

# Karpenter never voluntarily disrupts a node running a pod with this annotation (consolidation, drift); Spot
# interruptions still happen and the job's resume covers them.
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"

# RFC 1035 label: what Services (the Ray head service among them) need; stricter than RFC 1123, so fits both.
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^(\d+(\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def check_dns_label(value: str, what: str, max_length: int = 63) -> str:
    """`value` if it is a lowercase DNS label of at most `max_length` characters, else a ValueError."""
    if len(value) > max_length or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{what} {value!r} must be at most {max_length} characters of lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit"
        )
    return value


def check_quantity(value: str, what: str) -> str:
    """`value` if it is a Kubernetes quantity such as '500m', '4' or '16Gi', else a ValueError."""
    if not _QUANTITY.match(value):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity (e.g. '500m', '4', '16Gi')")
    return value


def quantity_value(value: str) -> float:
    """A quantity as a plain number: CPUs for cpu quantities, bytes for memory ones."""
    match = _QUANTITY.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = float(match.group(1)), match.group(3)
    if suffix is None:
        return number
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def check_labels(labels: Mapping[str, str], what: str) -> dict[str, str]:
    """A copy of `labels` if every key and value is a valid Kubernetes label; else a ValueError naming it."""
    for key, value in labels.items():
        if not _LABEL_KEY.match(key):
            raise ValueError(f"{what}: {key!r} is not a valid Kubernetes label key")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ValueError(f"{what}: value {value!r} of {key!r} is not a valid Kubernetes label value")
    return dict(labels)


def base_labels(component: str) -> dict[str, str]:
    """The labels every object of the project carries, so `kubectl get -l` finds them all."""
    return {APP_LABEL: APP_NAME, PART_OF_LABEL: APP_NAME, COMPONENT_LABEL: component}


def gpu_toleration() -> dict[str, str]:
    """Lets a pod onto the tainted GPU nodes; only pods that request a GPU carry it."""
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def head_toleration() -> dict[str, str]:
    """Lets a pod onto the tainted head nodes; only Ray heads and the RayJob's submitter carry it."""
    return {"key": POOL_LABEL, "operator": "Equal", "value": HEAD_POOL, "effect": HEAD_TAINT_EFFECT}


def pod_security_labels() -> dict[str, str]:
    """The namespace labels that make the API server refuse any pod below the `restricted` Pod Security level.

    The version is pinned to the cluster's, so an upgrade that tightens `restricted` is a deliberate change here
    rather than pods refused on the night after the upgrade.
    """
    return {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": f"v{KUBERNETES_VERSION}",
    }
