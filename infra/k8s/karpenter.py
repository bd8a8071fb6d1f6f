"""Karpenter's EC2NodeClass and the Spot-first GPU NodePool of the large tier.

The node class says how a node is built (AMI, IMDSv2, encrypted disk, where it goes, its cost tags); the node
pool says which nodes may be built for which pods, how many at most, and when Karpenter may take them away.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.k8s.common import (
    GPU_POOL,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    HEAD_POOL,
    HEAD_TAINT_EFFECT,
    POOL_LABEL,
    Manifest,
    base_labels,
    check_dns_label,
    check_labels,
    check_quantity,
    quantity_value,
)
from infra.k8s.instance_types import shape_of

NODE_CLASS_API_VERSION = "karpenter.k8s.aws/v1"
NODE_POOL_API_VERSION = "karpenter.sh/v1"
# Karpenter tries NodePools of higher weight first: the Spot pools before their on-demand fallbacks.
SPOT_WEIGHT = 100
FALLBACK_WEIGHT = 10
# Subnets and security groups carrying this tag (value: the cluster name) are where Karpenter puts nodes.
DISCOVERY_TAG = "karpenter.sh/discovery"

_AMI_ALIAS = re.compile(r"^(al2023|bottlerocket)@v\d+(\.\d+){0,2}$")
_DURATION = re.compile(r"^([0-9]+(s|m|h))+$")
# Tag keys Karpenter sets itself and rejects in spec.tags (its CEL rules, which a schema check does not run).
_RESERVED_TAG = re.compile(r"^(kubernetes\.io/cluster/|karpenter\.sh/(nodepool|nodeclaim)$|karpenter\.k8s\.aws/)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeClassArgs(_Strict):
    name: str = Field("gpu", description="EC2NodeClass name.")
    cluster_name: str = Field(description="Value of the discovery tag on the cluster's private subnets and SG.")
    node_role: str = Field(description="IAM role name of the nodes (Karpenter makes the instance profile).")
    ami_alias: str = Field(
        description="Pinned AMI alias, e.g. 'al2023@v20260714'; Karpenter picks the NVIDIA variant for GPUs."
    )
    volume_size_gib: int = Field(200, ge=20, le=16384, description="Root volume: the image and model cache.")
    volume_kms_key_id: str | None = Field(None, description="KMS key for the root volume; None: aws/ebs.")
    tags: dict[str, str] = Field(default_factory=dict, description="Cost-allocation tags on every instance.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_dns_label(value, "EC2NodeClass name")

    @field_validator("ami_alias")
    @classmethod
    def _alias(cls, value: str) -> str:
        if not _AMI_ALIAS.match(value):
            raise ValueError(f"ami_alias {value!r} must be a pinned alias such as 'al2023@v20260714' (not '@latest')")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if _RESERVED_TAG.match(key):
                raise ValueError(f"tag {key!r} is set by Karpenter itself and may not be in the node class tags")
        return value


class DisruptionBudget(_Strict):
    nodes: str = Field(description="Nodes (count or percent) that may be disrupted at once.")
    reasons: list[Literal["Underutilized", "Empty", "Drifted"]] | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: str) -> str:
        if not re.match(r"^((100|[0-9]{1,2})%|[0-9]+)$", value):
            raise ValueError(f"disruption budget nodes {value!r} must be a count ('1') or a percent ('10%')")
        return value


class NodePoolArgs(_Strict):
    name: str = Field("gpu-spot", description="NodePool name.")
    node_class: str = Field("gpu", description="The EC2NodeClass the nodes are built from.")
    # One-GPU types only: a worker pod takes all of its node's GPUs (one copy of the model per node), and the
    # large tier's workers take one (infra/config/eks.py refuses a pool whose types' GPU counts differ from the
    # workers'). Eight-GPU workers list eight-GPU types: ["p4d.24xlarge", "g5.48xlarge"] (and p5.48xlarge where
    # the stack's region offers it, infra/config/regional_types.py).
    instance_types: list[str] = Field(default_factory=lambda: ["g5.xlarge", "g5.2xlarge"])
    on_demand_fallback: bool = Field(
        True,
        description="Spot first; beside this pool, a lower-weight on-demand pool (`<name>-on-demand` less the "
        "`-spot`) that Karpenter uses only when no Spot node of these types can be had.",
    )
    on_demand_gpu_limit: int = Field(
        8,
        ge=1,
        description="The on-demand fallback pool's `nvidia.com/gpu` limit: Karpenter has no price field, so this "
        "bounds the worst-case dollars an hour (the estimate shows them).",
    )
    spot: bool = Field(True, description="Spot capacity at all; False: on-demand nodes only.")
    weight: int | None = Field(
        None,
        ge=1,
        le=100,
        description="Karpenter tries pools of higher weight first; None: no weight (the Spot pools get "
        "SPOT_WEIGHT, their on-demand fallbacks FALLBACK_WEIGHT).",
    )
    pool: str = Field(
        GPU_POOL,
        description="The `llm-batch.io/pool` label of its nodes, which pods select: one workload's pool each.",
    )
    cpu_limit: str = "256"
    # 1280Gi, not 1024Gi: one p4d.24xlarge alone has 1152 GiB, and Karpenter skips any type bigger than the
    # room left under the limits, so with 1024Gi a pool of eight-GPU workers listing the p4d could never launch it.
    memory_limit: str = "1280Gi"
    gpu_limit: int = Field(16, ge=1)
    consolidate_after: str = Field("300s", description="How long a node stays empty or underused before removal.")
    budgets: list[DisruptionBudget] = Field(
        default_factory=lambda: [
            DisruptionBudget(nodes="10%"),
            # Underused nodes only go one at a time; a node running Ray pods is never chosen at all (they
            # carry karpenter.sh/do-not-disrupt), so a run loses nodes only to Spot itself.
            DisruptionBudget(nodes="1", reasons=["Underutilized"]),
        ]
    )
    expire_after: str = Field("168h", description="Nodes are replaced after this (fresh AMI patches).")
    termination_grace: str = Field(
        "2h", description="Longest a node waits for its pods when Karpenter does remove it (expiry, drift)."
    )

    @field_validator("name", "node_class", "pool")
    @classmethod
    def _name(cls, value: str, info: Any) -> str:
        return check_dns_label(value, info.field_name)

    @field_validator("cpu_limit", "memory_limit")
    @classmethod
    def _quantity(cls, value: str, info: Any) -> str:
        return check_quantity(value, info.field_name)

    @field_validator("consolidate_after", "expire_after", "termination_grace")
    @classmethod
    def _duration(cls, value: str, info: Any) -> str:
        if not _DURATION.match(value):
            raise ValueError(f"{info.field_name} {value!r} must be a duration such as '300s', '5m' or '168h'")
        return value

    @property
    def fallback_name(self) -> str:
        """The on-demand fallback pool's name: `gpu-spot` -> `gpu-on-demand`."""
        return f"{self.name.removesuffix('-spot')}-on-demand"

    def spot_and_fallback(self) -> list[NodePoolArgs]:
        """The pools this one stands for: itself (Spot, weighted first) and, with `on_demand_fallback`, an
        on-demand pool of the same types and pool label, weighted below it and bounded by
        `on_demand_gpu_limit` GPUs (cpu and memory limits scaled to the nodes that many GPUs allow)."""
        if not self.spot or not self.on_demand_fallback:
            return [self]
        spot = self.model_copy(update={"on_demand_fallback": False, "weight": self.weight or SPOT_WEIGHT})
        nodes = max(1, self.on_demand_gpu_limit // min(shape_of(t).gpus for t in self.instance_types))
        fallback = self.model_copy(
            update={
                "name": self.fallback_name,
                "spot": False,
                "on_demand_fallback": False,
                "weight": FALLBACK_WEIGHT,
                "gpu_limit": self.on_demand_gpu_limit,
                "cpu_limit": str(nodes * max(shape_of(t).vcpus for t in self.instance_types)),
                "memory_limit": f"{nodes * max(shape_of(t).memory_gib for t in self.instance_types)}Gi",
            }
        )
        return [spot, NodePoolArgs.model_validate(fallback.model_dump())]

    @model_validator(mode="after")
    def _types_fit_limits(self) -> NodePoolArgs:
        if not self.instance_types:
            raise ValueError("instance_types is empty: the NodePool could launch nothing")
        if self.on_demand_fallback and self.spot:
            most = max(shape_of(t).gpus for t in self.instance_types)
            if self.on_demand_gpu_limit < most:
                raise ValueError(
                    f"on_demand_gpu_limit ({self.on_demand_gpu_limit}) is less than the {most} GPUs of one node "
                    "of instance_types: the on-demand fallback could never launch its largest type"
                )
        cpus, memory_gib = quantity_value(self.cpu_limit), quantity_value(self.memory_limit) / 2**30
        for instance_type in self.instance_types:
            shape = shape_of(instance_type)
            if shape.gpus == 0:
                raise ValueError(f"instance_types: {instance_type} has no GPU; this is the GPU pool")
            # Karpenter never launches a node that would by itself exceed the pool's limits.
            if shape.vcpus > cpus or shape.memory_gib > memory_gib or shape.gpus > self.gpu_limit:
                raise ValueError(
                    f"instance_types: {instance_type} ({shape.vcpus} vCPU, {shape.memory_gib} GiB, "
                    f"{shape.gpus} GPU) is larger than the pool's limits (cpu {self.cpu_limit}, memory "
                    f"{self.memory_limit}, {GPU_RESOURCE} {self.gpu_limit}), so Karpenter could never "
                    "launch it"
                )
        return self


def render_node_class(args: NodeClassArgs) -> Manifest:
    """How GPU nodes are built: pinned AMI, IMDSv2 only and out of pods' reach, encrypted root volume."""
    ebs: dict[str, Any] = {
        "volumeSize": f"{args.volume_size_gib}Gi",
        "volumeType": "gp3",
        "encrypted": True,
        "deleteOnTermination": True,
    }
    if args.volume_kms_key_id:
        ebs["kmsKeyID"] = args.volume_kms_key_id
    selector = [{"tags": {DISCOVERY_TAG: args.cluster_name}}]
    return {
        "apiVersion": NODE_CLASS_API_VERSION,
        "kind": "EC2NodeClass",
        "metadata": {"name": args.name, "labels": base_labels("karpenter")},
        "spec": {
            "role": args.node_role,
            "amiSelectorTerms": [{"alias": args.ami_alias}],
            "subnetSelectorTerms": selector,
            "securityGroupSelectorTerms": selector,
            "associatePublicIPAddress": False,
            # Hop limit 1: pods cannot reach the node's credentials; they get their own through IRSA.
            "metadataOptions": {
                "httpEndpoint": "enabled",
                "httpProtocolIPv6": "disabled",
                "httpPutResponseHopLimit": 1,
                "httpTokens": "required",
            },
            "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": ebs}],
            # Every GPU type the pools launch has NVMe instance store (g5: 250 GB to 2 x 3.8 TB; p4d: 8 x 1 TB;
            # p5: 8 x 3.84 TB).
            # RAID0 makes it the node's ephemeral storage (kubelet and containerd), so the pods' `models` emptyDir,
            # the weights and the compile caches land on local NVMe instead of the gp3 root volume's 125 MiB/s
            # (docs/model-and-nodes.md). A type without instance store keeps the root volume.
            "instanceStorePolicy": "RAID0",
            "tags": dict(args.tags),
        },
    }


def render_node_pool(args: NodePoolArgs) -> Manifest:
    """One GPU pool: tainted for GPU pods only, bounded by limits, consolidated when idle. A Spot pool with
    `on_demand_fallback` is rendered as two by `render_node_pools`; alone here it lists both capacity types."""
    capacity = ["spot", "on-demand"] if args.on_demand_fallback else ["spot"]
    if not args.spot:
        capacity = ["on-demand"]
    budgets: list[dict[str, Any]] = [budget.model_dump(exclude_none=True) for budget in args.budgets]
    weight: dict[str, Any] = {} if args.weight is None else {"weight": args.weight}
    return {
        "apiVersion": NODE_POOL_API_VERSION,
        "kind": "NodePool",
        "metadata": {"name": args.name, "labels": base_labels("karpenter")},
        "spec": {
            **weight,
            "template": {
                "metadata": {"labels": check_labels({POOL_LABEL: args.pool}, "node labels")},
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.k8s.aws",
                        "kind": "EC2NodeClass",
                        "name": args.node_class,
                    },
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": args.instance_types,
                        },
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    ],
                    "taints": [{"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": "NoSchedule"}],
                    "expireAfter": args.expire_after,
                    "terminationGracePeriod": args.termination_grace,
                },
            },
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": args.consolidate_after,
                "budgets": budgets,
            },
            "limits": {"cpu": args.cpu_limit, "memory": args.memory_limit, GPU_RESOURCE: str(args.gpu_limit)},
        },
    }


def render_node_pools(args: NodePoolArgs) -> list[Manifest]:
    """The Spot pool and its lower-weight on-demand fallback (NodePoolArgs.spot_and_fallback)."""
    return [render_node_pool(pool) for pool in args.spot_and_fallback()]


def render_head_node_pool(instance_type: str, max_nodes: int, node_class: str, name: str = "head") -> Manifest:
    """The large tier's on-demand head nodes: none between runs; one when a Ray head is Pending, removed a minute
    after it is empty. Tainted like the medium tier's managed head group, so only Ray heads and the submitter land
    there; bounded by its limits to `max_nodes` nodes of `instance_type`."""
    shape = shape_of(instance_type)
    if shape.gpus:
        raise ValueError(f"eks.head_instance_type {instance_type} has GPUs; the head pool is for CPU nodes")
    return {
        "apiVersion": NODE_POOL_API_VERSION,
        "kind": "NodePool",
        "metadata": {"name": name, "labels": base_labels("karpenter")},
        "spec": {
            "template": {
                "metadata": {"labels": check_labels({POOL_LABEL: HEAD_POOL}, "node labels")},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [instance_type]},
                        # The Ray head's node must not vanish mid-run: on-demand only.
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    ],
                    "taints": [{"key": POOL_LABEL, "value": HEAD_POOL, "effect": HEAD_TAINT_EFFECT}],
                    "expireAfter": "168h",
                    "terminationGracePeriod": "2h",
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "60s"},
            "limits": {"cpu": str(shape.vcpus * max_nodes), "memory": f"{shape.memory_gib * max_nodes}Gi"},
        },
    }
