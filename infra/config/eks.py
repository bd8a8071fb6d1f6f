"""The EKS tiers' sections: the cluster (`eks`: version, endpoint access, node groups, pod sizes) and the online
endpoint (`serve`), with the checks that a pod fits the nodes it is meant for.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from infra import facts, versions
from infra.config.sections import (
    NAMESPACE,
    _Section,
)
from infra.facts import instance_regions
from infra.k8s.common import GPU8_POOL, check_dns_label, quantity_value
from infra.k8s.head_group import (
    SERVE_REPORTER,
    SYSTEM_NODES,
    RayHead,
    Requests,
    head_group_shortfall,
    pods_on_head_group,
    pods_on_system_group,
)
from infra.k8s.instance_types import NODE_MEMORY_SHARE, NODE_RESERVED_CPU, shape_of
from infra.k8s.karpenter import NodePoolArgs
from infra.k8s.rayjob import PodSize
from monitoring.alarms import ServeWatch

# The most addresses the API server's public endpoint may admit in all: a /8, more than any organisation's
# egress ranges, far less than "the internet".
MAX_PUBLIC_ENDPOINT_BITS = 24
MAX_PUBLIC_ENDPOINT_ADDRESSES = 2**MAX_PUBLIC_ENDPOINT_BITS


class EightGpuWorkers(_Section):
    """The large tier's second GPU worker group: one worker pod per eight-GPU node, for a model whose engine needs
    more than one GPU (tensor parallel), beside the one-GPU group of `eks.node_pool` and `eks.worker_size`."""

    enabled: bool = Field(True, description="Its NodePools (Spot, and the on-demand fallback) on Karpenter's tier.")
    node_pool: NodePoolArgs = Field(
        NodePoolArgs(
            name="gpu8-spot",
            pool=GPU8_POOL,
            instance_types=["p4d.24xlarge", "g5.48xlarge"],
            # Two nodes of the largest type it may list (p5.48xlarge where offered: 192 vCPU, 2048 GiB): Karpenter
            # launches no node that would pass a limit, so lower limits would stop the second p5. The GPU limit,
            # not these, is what bounds the pool (and its dollars).
            cpu_limit="384",
            memory_limit="4096Gi",
            gpu_limit=16,
            on_demand_gpu_limit=8,
        ),
        description="The eight-GPU types' Spot-first NodePool (its own `llm-batch.io/pool` label).",
    )
    worker_size: PodSize = Field(
        # The smaller type's allocatable: p4d.24xlarge's 96 vCPU less the node's reserve; g5.48xlarge's 768 GiB
        # at the node's memory share (infra/k8s/instance_types.py).
        PodSize(cpu="90", memory="640Gi", gpus=8),
        description="Each eight-GPU worker pod (= limits): all of its node's GPUs.",
    )
    max_nodes: int = Field(2, ge=1, description="Most eight-GPU workers at once (one per node).")
    where_offered: list[str] = Field(
        ["p5.48xlarge"],
        description="Eight-GPU types added to both pools (Spot and fallback) only where the stack's region offers "
        "them, as infra/facts/instance_regions.json lists (infra/config/regional_types.py); [] adds none.",
    )

    @field_validator("where_offered")
    @classmethod
    def _known_regional_types(cls, value: list[str]) -> list[str]:
        for instance_type in value:
            shape_of(instance_type)  # a ValueError lists the known shapes
            instance_regions.regions_offering(instance_type)  # a FactsError (a ValueError) names the table
        return value


class EksConfig(_Section):
    version: str = Field(
        versions.KUBERNETES_VERSION,
        description="Kubernetes version of the control plane and the node groups; one listed in "
        "infra/facts/eks_versions.json. EKS upgrades one minor version at a time (docs/deploy-eks.md).",
    )
    support_type: Literal["STANDARD", "EXTENDED"] = Field(
        "STANDARD",
        description="The cluster's upgrade policy at the end of standard support: STANDARD, AWS upgrades it to "
        "the next version; EXTENDED, it stays and is billed extended support (six times the price).",
    )
    head_instance_type: str = Field(
        "m5.xlarge", description="On-demand node for the Ray head, started for a run and gone after it."
    )
    head_nodes: int = Field(
        1, ge=1, le=5, description="Most on-demand head nodes at once (0 between runs); the Ray heads must fit."
    )
    system_instance_type: str = Field(
        "t3.medium",
        description="The one always-on node for CoreDNS and the operators (KubeRay, Karpenter or the cluster "
        "autoscaler): what must answer between runs.",
    )
    system_volume_gib: int = Field(20, ge=20, le=16384, description="Encrypted gp3 root volume of the system node.")
    gpu_instance_type: str = Field("g5.2xlarge", description="Spot GPU worker instance type (managed group).")
    gpu_max_nodes: int = Field(2, ge=1, description="Most GPU workers at once (one per GPU node).")
    gpu_min_workers: int = Field(
        1, ge=0, description="Ray workers a run starts with when Ray autoscales (Karpenter tier)."
    )
    node_volume_gib: int = Field(200, ge=50, le=16384, description="Encrypted gp3 root volume of every node.")
    head_size: PodSize = Field(PodSize(cpu="2", memory="8Gi"), description="Ray head pod requests (= limits).")
    worker_size: PodSize = Field(
        PodSize(cpu="6", memory="24Gi", gpus=1), description="Ray worker pod requests (= limits)."
    )
    namespace: str = Field(NAMESPACE, description="Kubernetes namespace of the job's pods.")
    service_account: str = Field("llm-batch-job", description="Service account the Ray head runs as (IRSA).")
    worker_service_account: str = Field(
        "llm-batch-worker",
        description="Service account of the GPU workers: the job's IRSA role, no Kubernetes API token or rights.",
    )
    job_backoff_limit: int = Field(2, ge=0, le=10, description="RayJob retries, each on a fresh cluster.")
    job_ttl_after_finished_s: int = Field(
        60, ge=0, le=3600, description="Seconds a finished run's cluster is kept for its logs."
    )
    endpoint_public_access_cidrs: list[str] = Field(
        default_factory=list,
        description="Public IPv4 CIDRs of the machines that run `pulumi up` (and kubectl): the API server's public "
        "endpoint admits only these, its private endpoint stays on for nodes and the nightly run. Empty: private "
        "endpoint only, which nothing outside the VPC can reach, so `pulumi up` stops (docs/deploy-eks.md).",
    )
    karpenter_enabled: bool = Field(False, description="Karpenter NodePool instead of a managed GPU group.")
    ami_alias: str = Field(versions.EKS_AMI_ALIAS, description="Pinned AL2023 alias of Karpenter's nodes.")
    node_pool: NodePoolArgs = Field(NodePoolArgs(), description="Karpenter's Spot-first one-GPU NodePool.")
    eight_gpu: EightGpuWorkers = Field(
        EightGpuWorkers(),
        description="Karpenter's tier: the eight-GPU worker group and its pools; the stack's model decides which "
        "group runs the night (StackConfig.night_workers).",
    )

    @field_validator("endpoint_public_access_cidrs")
    @classmethod
    def _no_open_endpoint(cls, value: list[str]) -> list[str]:
        networks: list[ipaddress.IPv4Network] = []
        for cidr in value:
            try:
                network = ipaddress.ip_network(cidr)
            except ValueError as error:
                raise ValueError(f"not a CIDR block: {error}") from None
            if not isinstance(network, ipaddress.IPv4Network):
                raise ValueError(f"{cidr}: EKS's public endpoint takes IPv4 CIDR blocks only")
            networks.append(network)
        # Judged together: 0.0.0.0/1 and 128.0.0.0/1 open the API as surely as 0.0.0.0/0 does.
        covered = sum(network.num_addresses for network in ipaddress.collapse_addresses(networks))
        if covered > MAX_PUBLIC_ENDPOINT_ADDRESSES:
            share = covered / 2**32
            raise ValueError(
                f"{value} together admit {covered:,} addresses ({share:.1%} of IPv4): that opens the API server "
                f"to the internet; list the deployers' own ranges (at most a /{32 - MAX_PUBLIC_ENDPOINT_BITS} "
                "in all)"
            )
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _minor_as_text(cls, value: Any) -> Any:
        # `version: 1.30` in YAML (or `pulumi config set --path ... 1.30` stored as a number) is the float 1.3.
        return f"{value:.2f}" if isinstance(value, float) else value

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        facts.version_support(value)  # a FactsError (a ValueError) names the table to add it to
        return value

    @field_validator("namespace", "service_account", "worker_service_account")
    @classmethod
    def _dns_label(cls, value: str, info: Any) -> str:
        return check_dns_label(value, info.field_name)

    @property
    def ray_heads(self) -> list[RayHead]:
        """The nightly RayJob's Ray head on the head group (with its autoscaler sidecar when Ray autoscales,
        Karpenter's tier, and its submitter pod). The online endpoint's RayService head, configured outside this
        section, joins it in `StackConfig._serve_fits` (`ServeSection.ray_heads`)."""
        return [
            RayHead(
                "nightly RayJob",
                Requests(cpu=self.head_size.cpu, memory=self.head_size.memory),
                autoscaler=self.karpenter_enabled,
                submitter=True,
            )
        ]

    @model_validator(mode="after")
    def _images_exist_for_the_version(self) -> EksConfig:
        if self.karpenter_enabled:
            oldest, newest = versions.KARPENTER_KUBERNETES_RANGE
            karpenter = versions.HELM_CHARTS["karpenter"][1]
            if not facts.minor(oldest) <= facts.minor(self.version) <= facts.minor(newest):
                raise ValueError(
                    f"version {self.version} is outside what Karpenter {karpenter} supports ({oldest} to {newest}, "
                    "infra/versions.py KARPENTER_KUBERNETES_RANGE): choose a version in that range, or move the "
                    "karpenter chart to a release that supports it"
                )
        if self.karpenter_enabled and (problem := facts.alias_problem(self.ami_alias, self.version)):
            raise ValueError(f"ami_alias {problem}; Karpenter would find no AMI and start no GPU node")
        if not self.karpenter_enabled and self.version not in versions.CLUSTER_AUTOSCALER_IMAGE_TAGS:
            raise ValueError(
                f"version {self.version} has no cluster autoscaler image in infra/versions.py "
                "CLUSTER_AUTOSCALER_IMAGE_TAGS (its minor must match the control plane's)"
            )
        return self

    @model_validator(mode="after")
    def _pods_fit_nodes(self) -> EksConfig:
        system = pods_on_system_group(karpenter=self.karpenter_enabled)
        shortfall = head_group_shortfall(system, shape_of(self.system_instance_type), SYSTEM_NODES)
        if shortfall is not None:
            raise ValueError(
                f"eks.system_instance_type {self.system_instance_type} cannot hold the operators and system pods: "
                f"{shortfall}; choose a larger system_instance_type"
            )
        pods = pods_on_head_group(self.ray_heads)
        shortfall = head_group_shortfall(pods, shape_of(self.head_instance_type), self.head_nodes)
        if shortfall is not None:
            raise ValueError(
                f"eks.head_instance_type {self.head_instance_type} x eks.head_nodes {self.head_nodes} cannot hold "
                f"what runs on the head group: {shortfall}; choose a larger head_instance_type, more head_nodes "
                "or a smaller head_size"
            )
        if self.karpenter_enabled:
            pool_types = self.node_pool.instance_types
            _check_fits(self.worker_size, pool_types, "worker_size", "node_pool.instance_types")
            _check_whole_node(self.worker_size, pool_types, "worker_size", "node_pool.instance_types")
            gpus = self.gpu_max_nodes * self.worker_size.gpus
            if gpus > self.node_pool.gpu_limit:
                raise ValueError(
                    f"gpu_max_nodes x worker_size.gpus ({gpus}) is more than node_pool.gpu_limit "
                    f"({self.node_pool.gpu_limit}): the last workers could never start"
                )
            if self.gpu_min_workers > self.gpu_max_nodes:
                raise ValueError(
                    f"gpu_min_workers ({self.gpu_min_workers}) is more than gpu_max_nodes ({self.gpu_max_nodes})"
                )
            wide = self.eight_gpu
            if wide.enabled:
                wide_types = wide.node_pool.instance_types
                _check_fits(wide.worker_size, wide_types, "eight_gpu.worker_size", "eight_gpu.node_pool.instance_types")
                _check_whole_node(
                    wide.worker_size, wide_types, "eight_gpu.worker_size", "eight_gpu.node_pool.instance_types"
                )
                _check_limits_hold(wide.node_pool, wide.max_nodes, "eight_gpu")
                if wide.max_nodes * wide.worker_size.gpus > wide.node_pool.gpu_limit:
                    raise ValueError(
                        f"eight_gpu.max_nodes x eight_gpu.worker_size.gpus ({wide.max_nodes * wide.worker_size.gpus}) "
                        f"is more than eight_gpu.node_pool.gpu_limit ({wide.node_pool.gpu_limit}): the last workers "
                        "could never start"
                    )
                if wide.node_pool.pool == self.node_pool.pool or wide.node_pool.name == self.node_pool.name:
                    raise ValueError(
                        "eight_gpu.node_pool needs its own name and pool label: one-GPU and eight-GPU workers "
                        "must not land on each other's nodes"
                    )
        else:
            _check_fits(self.worker_size, [self.gpu_instance_type], "worker_size", "gpu_instance_type")
            _check_whole_node(self.worker_size, [self.gpu_instance_type], "worker_size", "gpu_instance_type")
        return self


def _check_fits(size: PodSize, instance_types: list[str], size_key: str, types_key: str) -> None:
    """A ValueError unless one pod of `size` fits on at least one of `instance_types` beside its daemons."""
    cpu, memory_gib = quantity_value(size.cpu), quantity_value(size.memory) / 2**30
    for instance_type in instance_types:
        shape = shape_of(instance_type)
        if (
            cpu <= shape.vcpus - NODE_RESERVED_CPU
            and memory_gib <= shape.memory_gib * NODE_MEMORY_SHARE
            and size.gpus <= shape.gpus
        ):
            return
    raise ValueError(
        f"{size_key} ({size.cpu} CPU, {size.memory}, {size.gpus} GPU) fits no node of {types_key} "
        f"{instance_types} after the node's own reserve ({NODE_RESERVED_CPU} CPU, "
        f"{int((1 - NODE_MEMORY_SHARE) * 100)}% memory)"
    )


def _check_limits_hold(pool: NodePoolArgs, nodes: int, key: str) -> None:
    """A ValueError unless the pool's cpu and memory limits hold `nodes` nodes of each of its types: Karpenter
    launches no node that would pass a limit, so a lower one strands the last workers on the larger types."""
    cpus, memory_gib = quantity_value(pool.cpu_limit), quantity_value(pool.memory_limit) / 2**30
    for instance_type in pool.instance_types:
        shape = shape_of(instance_type)
        if nodes * shape.vcpus > cpus or nodes * shape.memory_gib > memory_gib:
            raise ValueError(
                f"{key}.node_pool limits (cpu {pool.cpu_limit}, memory {pool.memory_limit}) cannot hold "
                f"{key}.max_nodes ({nodes}) nodes of {instance_type} ({shape.vcpus} vCPU, {shape.memory_gib} GiB "
                f"each): raise them to cpu {nodes * shape.vcpus}, memory {nodes * shape.memory_gib}Gi or more"
            )


def _check_whole_node(size: PodSize, instance_types: list[str], size_key: str, types_key: str) -> None:
    """A ValueError unless a pod of `size` takes every GPU of each of `instance_types`.

    A worker pod is the unit that holds one copy of the model (its /models emptyDir; the restricted Pod Security
    level forbids a hostPath the pods of a node could share). A pod with all of its node's GPUs runs all of the
    node's engines (GPUs / tensor_parallel_size), which share that copy and fetch it once (the node lock of
    workload/engine/model_source.py); smaller pods would each fetch their own onto one disk
    (docs/model-and-nodes.md, "One copy of the model per node").
    """
    for instance_type in instance_types:
        gpus = shape_of(instance_type).gpus
        if gpus != size.gpus:
            raise ValueError(
                f"{size_key}.gpus ({size.gpus}) is not the {gpus} GPUs of {instance_type} in {types_key}: a worker "
                "pod takes all of its node's GPUs, so the node's engines share one copy of the model; set "
                f"{size_key}.gpus to {gpus} (and its cpu and memory to that node's) or list only types with "
                f"{size.gpus} GPU(s)"
            )


class ServeSection(_Section):
    """The online endpoint of the EKS tiers: the job's model and engine, served by a KubeRay RayService."""

    enabled: bool = Field(False, description="Serve the job's model from a RayService (medium and large tiers).")
    min_replicas: int = Field(
        0, ge=0, description="Engine replicas kept while idle; 0: a GPU node only while there is traffic."
    )
    max_replicas: int = Field(2, ge=1, description="Most engine replicas (one GPU node each) under load.")
    target_ongoing_requests: int = Field(
        16, ge=1, description="Requests in flight per replica that Serve's autoscaler aims for; more adds replicas."
    )
    busy_hours_per_day: float = Field(
        8,
        ge=0,
        le=24,
        description="Hours a day the endpoint has traffic, for the estimate: max_replicas GPU nodes "
        "then, min_replicas the rest of the day.",
    )
    instance_type: str = Field("g5.xlarge", description="GPU instance type of the endpoint's own node pool.")
    capacity_type: Literal["on-demand", "spot"] = Field(
        "on-demand",
        description="On-demand by default: a Spot interruption drops the requests in flight on that replica.",
    )
    worker_size: PodSize = Field(
        PodSize(cpu="3", memory="12Gi", gpus=1), description="Each engine replica's Ray worker pod (= limits)."
    )
    head_size: PodSize = Field(
        PodSize(cpu="1", memory="4Gi"),
        description="The RayService's head: Serve's controller, the HTTP proxy and the ingress (on the head group).",
    )
    internal_load_balancer: bool = Field(
        False,
        description="Also an internal AWS load balancer in front of the endpoint (never internet-facing); "
        "off: a ClusterIP Service, reached from inside the cluster or by kubectl port-forward.",
    )
    alarm_latency_p95_ms: float = Field(
        30000, gt=0, description="The endpoint's p95 request latency over this (ms) for two periods alarms."
    )
    alarm_error_ratio: float = Field(
        0.02, gt=0, le=1, description="5xx answers / requests in a 5-minute period over this alarms."
    )
    api_keys_secret_name: str | None = Field(
        None,
        description='Name of the Secrets Manager secret holding the endpoint\'s API keys (JSON {"keys": [...]} or '
        "one per line); None: `llm-batch-<stack>/serve-api-keys`. The stack creates it, encrypted with the stack's "
        "key and without a value: put the keys with `aws secretsmanager put-secret-value` (docs/serve.md). Only "
        "the endpoint's pods' role may read it; replicas re-read it every 30 s.",
    )
    endpoint_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Merged into the endpoint's `serve` settings (workload.contract.serve_config.ServeSettings), e.g. "
        "model_id or max_ongoing_requests; host and port are the cluster's.",
    )

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if shape_of(value).gpus < 1:
            raise ValueError(f"{value} has no GPU; the endpoint's engines need one")
        return value

    @field_validator("endpoint_overrides")
    @classmethod
    def _no_listener(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("host", "port", "haproxy", "direct_streaming", "api_key_secret", "api_key_file"):
            if key in value:
                raise ValueError(f"'{key}' is set by the RayService (infra/k8s/rayservice.py), not by overrides")
        return value

    @field_validator("api_keys_secret_name")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        # Secrets Manager's own rule for names (1-512 of these characters); an ARN is not a name.
        if value is not None and (not re.fullmatch(r"[A-Za-z0-9/_+=.@-]{1,512}", value) or value.startswith("arn:")):
            raise ValueError(f"{value!r} is not a Secrets Manager secret name (letters, digits and /_+=.@- only)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ServeSection:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is more than max_replicas ({self.max_replicas})")
        if self.worker_size.gpus < 1:
            raise ValueError("worker_size.gpus must be at least 1: each replica runs a GPU engine")
        _check_fits(self.worker_size, [self.instance_type], "worker_size", "instance_type")
        _check_whole_node(self.worker_size, [self.instance_type], "worker_size", "instance_type")
        return self

    @property
    def ray_heads(self) -> list[RayHead]:
        """The RayService's heads on the head group, each with its metrics reporter and KubeRay's autoscaler
        sidecar (replicas autoscale): the serving cluster's, and the new cluster's that KubeRay starts beside it
        while it upgrades the RayService (a new image), until traffic has switched."""
        cpu = quantity_value(self.head_size.cpu) + quantity_value(SERVE_REPORTER.cpu)
        memory = quantity_value(self.head_size.memory) + quantity_value(SERVE_REPORTER.memory)
        requests = Requests(cpu=f"{round(cpu * 1000)}m", memory=f"{round(memory / 2**20)}Mi")
        return [
            RayHead(name, requests, autoscaler=True, submitter=False)
            for name in ("RayService", "RayService upgrade (new cluster)")
        ]

    @property
    def watch(self) -> ServeWatch:
        return ServeWatch(self.alarm_latency_p95_ms, self.alarm_error_ratio, self.max_replicas)
