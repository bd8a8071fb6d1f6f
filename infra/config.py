"""The stack's one typed config: tier defaults, overridden by the stack's Pulumi config, validated as a whole.

`stacks/Pulumi.<stack>.yaml` holds only what differs from `TIER_DEFAULTS[tier]`; keys live under the
`llm-batch:` namespace and sections may be nested objects, e.g.::

    config:
      llm-batch:tier: small
      llm-batch:cost_center: ml-platform
      llm-batch:network:
        az_count: 3

A bad value stops the program before any resource is registered, with a `StackConfigError` naming the key.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra import naming, versions
from infra.k8s.common import check_dns_label, quantity_value
from infra.k8s.head_group import SERVE_REPORTER, RayHead, Requests, head_group_shortfall, pods_on_head_group
from infra.k8s.instance_types import NODE_MEMORY_SHARE, NODE_RESERVED_CPU, shape_of
from infra.k8s.karpenter import NodePoolArgs
from infra.k8s.network_policy import SERVE_PORT
from infra.k8s.rayjob import PodSize
from monitoring.alarms import AlarmThresholds, ServeWatch
from workload.contract import entrypoint
from workload.contract.config import DEFAULT_METRICS_NAMESPACE, ConfigError, JobConfig, ResumeConfig, build_config
from workload.contract.serve_config import ServeConfig, build_serve_config

Tier = Literal["small", "medium", "large"]
InterfaceEndpoint = Literal["ecr.api", "ecr.dkr", "sts", "logs", "ssm", "ssmmessages", "ec2messages", "monitoring"]

NAMESPACE = "llm-batch"
# Config keys read as Pulumi secrets by the component that needs them, never part of the (printable) model.
SECRET_KEYS = frozenset({"hub_token"})

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TAG_KEY = re.compile(r"^[\w .:/=+@-]{1,128}$")


# How long a nightly attempt waits for an earlier attempt's lease on the same output before giving up.
NIGHTLY_LEASE_WAIT_S = 300.0


class StackConfigError(ValueError):
    """The stack's config is invalid; the message names each bad key (dotted, under `llm-batch:`)."""


class _Section(BaseModel):
    # A typo in a stack file must stop the deploy, not be ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class NetworkConfig(_Section):
    vpc_cidr: str = Field("10.40.0.0/16", description="CIDR of the VPC the program creates.")
    az_count: int = Field(2, ge=2, le=6, description="Availability zones with a private subnet each.")
    existing_vpc_id: str | None = Field(None, description="Use this VPC instead of creating one.")
    existing_private_subnet_ids: list[str] = Field(
        default_factory=list, description="Private subnets of `existing_vpc_id` (at least two zones)."
    )
    single_nat_gateway: bool = Field(
        True, description="One NAT gateway for all zones (cheaper) instead of one per zone (zone-resilient)."
    )
    interface_endpoints: list[InterfaceEndpoint] = Field(
        default_factory=list,
        description="Interface endpoints so this traffic skips NAT; S3 always has a gateway endpoint.",
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.ip_network(value)
        except ValueError as error:
            raise ValueError(f"not a CIDR block: {error}") from None
        if not 16 <= network.prefixlen <= 22:
            raise ValueError("the VPC CIDR must be between /16 and /22 (subnets are a /4 split of it)")
        return value

    @field_validator("interface_endpoints")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("an interface endpoint is listed twice")
        return value

    @model_validator(mode="after")
    def _existing_both_or_neither(self) -> NetworkConfig:
        if bool(self.existing_vpc_id) != bool(self.existing_private_subnet_ids):
            raise ValueError("existing_vpc_id and existing_private_subnet_ids go together: set both or neither")
        if self.existing_private_subnet_ids and len(self.existing_private_subnet_ids) < 2:
            raise ValueError("existing_private_subnet_ids needs subnets in at least two zones")
        return self

    @property
    def subnet_count(self) -> int:
        """How many private subnets the stack has (known from config, before any resource exists)."""
        return len(self.existing_private_subnet_ids) or self.az_count

    @property
    def create_vpc(self) -> bool:
        return self.existing_vpc_id is None


class StorageConfig(_Section):
    glacier_after_days: int = Field(30, ge=1, description="Days before job data moves to Glacier.")
    noncurrent_expire_days: int = Field(90, ge=1, description="Days before overwritten versions are deleted.")
    archive_prefixes: list[str] = Field(
        default_factory=lambda: ["input/", "output/", "checkpoints/"],
        description="Prefixes the Glacier rule covers; models/ stays hot because every run reads it.",
    )
    force_destroy: bool = Field(False, description="Let `pulumi destroy` delete a bucket that holds objects.")

    @model_validator(mode="after")
    def _expire_after_archive(self) -> StorageConfig:
        if self.noncurrent_expire_days <= self.glacier_after_days:
            raise ValueError("noncurrent_expire_days must be more than glacier_after_days")
        return self


class SmallConfig(_Section):
    instance_type: str = Field("g5.xlarge", description="The Spot GPU node's instance type.")
    root_volume_gib: int = Field(200, ge=50, le=16384, description="Encrypted gp3 root volume size.")
    gpu_ami_ssm_parameter: str = Field(
        versions.GPU_AMI_SSM_PARAMETER, description="Public SSM parameter holding the GPU AMI id."
    )
    max_spot_price: float | None = Field(
        None, gt=0, description="USD/hour cap on the Spot price; None: pay up to the on-demand price."
    )


# The most addresses the API server's public endpoint may admit in all: a /8, more than any organisation's
# egress ranges, far less than "the internet".
MAX_PUBLIC_ENDPOINT_BITS = 24
MAX_PUBLIC_ENDPOINT_ADDRESSES = 2**MAX_PUBLIC_ENDPOINT_BITS


class EksConfig(_Section):
    version: str = Field(versions.KUBERNETES_VERSION, description="Kubernetes version of the control plane.")
    head_instance_type: str = Field("m5.xlarge", description="On-demand node for the Ray head.")
    head_nodes: int = Field(
        1, ge=1, le=5, description="On-demand nodes for the Ray head and the operators (KubeRay, Karpenter)."
    )
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
    node_pool: NodePoolArgs = Field(NodePoolArgs(), description="Karpenter's Spot-first GPU NodePool.")

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
    def _pods_fit_nodes(self) -> EksConfig:
        pods = pods_on_head_group(self.ray_heads, karpenter=self.karpenter_enabled)
        shortfall = head_group_shortfall(pods, shape_of(self.head_instance_type), self.head_nodes)
        if shortfall is not None:
            raise ValueError(
                f"eks.head_instance_type {self.head_instance_type} x eks.head_nodes {self.head_nodes} cannot hold "
                f"what runs on the head group: {shortfall}; choose a larger head_instance_type, more head_nodes "
                "or a smaller head_size"
            )
        if self.karpenter_enabled:
            _check_fits(self.worker_size, self.node_pool.instance_types, "worker_size", "node_pool.instance_types")
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
        else:
            _check_fits(self.worker_size, [self.gpu_instance_type], "worker_size", "gpu_instance_type")
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
        for key in ("host", "port", "haproxy", "direct_streaming"):
            if key in value:
                raise ValueError(f"'{key}' is set by the RayService (infra/k8s/rayservice.py), not by overrides")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ServeSection:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is more than max_replicas ({self.max_replicas})")
        if self.worker_size.gpus < 1:
            raise ValueError("worker_size.gpus must be at least 1: each replica runs a GPU engine")
        _check_fits(self.worker_size, [self.instance_type], "worker_size", "instance_type")
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


class ScheduleConfig(_Section):
    cron: str = Field("cron(0 1 * * ? *)", description="EventBridge Scheduler expression of the nightly run.")
    timezone: str = Field("UTC", description="IANA time zone the expression is read in.")
    enabled: bool = Field(True, description="Whether the nightly schedule fires.")
    run_deadline_minutes: int = Field(360, ge=10, description="A run still going after this is stopped.")

    @field_validator("cron")
    @classmethod
    def _expression(cls, value: str) -> str:
        if not re.fullmatch(r"(cron|rate|at)\(.+\)", value.strip()):
            raise ValueError("must be an EventBridge Scheduler expression: cron(...), rate(...) or at(...)")
        return value.strip()


class JobSection(_Section):
    model_source: str | None = Field(
        None, description="Hugging Face id or s3:// prefix of the model; None: the job's tiny demo model."
    )
    input_prefix: str = Field("input/{date}/", description="Key prefix of a run's prompts; {date} is the run's.")
    output_prefix: str = Field("output/{date}/", description="Key prefix of a run's results.")
    job_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Merged into the job's workload.contract.config.JobConfig (nested keys)."
    )

    @field_validator("input_prefix", "output_prefix")
    @classmethod
    def _relative_prefix(cls, value: str) -> str:
        if value.startswith("/") or "://" in value or not value.endswith("/"):
            raise ValueError("must be a key prefix inside the data bucket, ending in '/', e.g. 'input/{date}/'")
        return value

    @field_validator("job_overrides")
    @classmethod
    def _no_locations(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("input", "output"):
            if key in value:
                raise ValueError(f"'{key}' comes from the bucket and {key}_prefix, not from job_overrides")
        return value


# The retention periods CloudWatch Logs accepts.
_LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
)  # fmt: skip


class MonitoringConfig(AlarmThresholds):
    """The job alarms' thresholds (inherited from `monitoring.alarms.AlarmThresholds`) and the rest."""

    metrics_namespace: str = Field(DEFAULT_METRICS_NAMESPACE, description="CloudWatch namespace of job metrics.")
    log_retention_days: int = Field(30, ge=1, description="Retention of the job's log group.")
    billing_alarm_usd: float | None = Field(
        None, gt=0, description="Alarm on the account's estimated charges; None: from the monthly budget."
    )
    account_billing_alarm: bool = Field(
        True,
        description="Make the alarm on the whole account's estimated charges (AWS/Billing has no per-stack "
        "figure) from this stack. Several stacks in one account: keep it on in one of them only (docs/cost.md).",
    )

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in _LOG_RETENTION_DAYS:
            raise ValueError(f"CloudWatch Logs accepts only {list(_LOG_RETENTION_DAYS)} days, not {value}")
        return value


class CostConfig(_Section):
    monthly_budget_usd: float = Field(400, gt=0, description="AWS Budgets monthly limit for this stack's tags.")
    daily_report_threshold_usd: float = Field(20, ge=0, description="The daily cost report flags a day above this.")
    nightly_hours: float = Field(4, gt=0, le=24, description="Expected GPU hours a night, for estimates.")
    activate_cost_allocation_tags: bool = Field(
        False,
        description="Activate the Stack and CostCenter cost-allocation tags from this stack. Off by default: "
        "Billing knows a tag only about a day after resources carry it, and in an Organizations member account "
        "only the payer account may activate it, so a first deploy would fail (docs/cost.md says who does it).",
    )


# ECR's rule for repository names: lowercase parts joined by . _ - and namespaced by /.
_ECR_REPOSITORY = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")


class ImageConfig(_Section):
    repository_name: str | None = Field(
        None,
        description="ECR repository of the job image; None: `llm-batch-<stack>/workload`, so stacks sharing "
        "an account never collide. The image's tag is its content hash, never configured.",
    )
    keep_last_images: int = Field(10, ge=1, le=1000, description="Images kept by the repository's lifecycle policy.")
    force_delete: bool = Field(
        True,
        description="Let `pulumi destroy` delete the repository while it holds images (ECR refuses otherwise). "
        "Safe by default: images are built from this repository's source and tagged by content, so a new "
        "deploy rebuilds them; set false to keep them, and delete them yourself before a destroy (docs/destroy.md).",
    )

    @field_validator("repository_name")
    @classmethod
    def _ecr_name(cls, value: str | None) -> str | None:
        if value is not None and not (2 <= len(value) <= 256 and _ECR_REPOSITORY.fullmatch(value)):
            raise ValueError(
                f"{value!r} is not an ECR repository name (2-256 characters: lowercase letters and digits, "
                "joined by . _ - and /)"
            )
        return value


class StackConfig(_Section):
    tier: Tier = Field(description="Which tier's defaults apply.")
    region: str = Field("us-east-1", description="AWS region of every resource (billing metrics: us-east-1).")
    cost_center: str = Field(description="The CostCenter cost-allocation tag; required.")
    owner: str = Field("ml-platform", description="The Owner tag: who answers for this stack.")
    environment: str = Field("production", description="The Environment tag.")
    alert_email: str | None = Field(None, description="E-mail subscribed to the alerts topic.")
    extra_tags: dict[str, str] = Field(default_factory=dict, description="More tags on every resource.")
    network: NetworkConfig = NetworkConfig()
    storage: StorageConfig = StorageConfig()
    small: SmallConfig = SmallConfig()
    eks: EksConfig = EksConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    job: JobSection = JobSection()
    monitoring: MonitoringConfig = MonitoringConfig()
    cost: CostConfig = CostConfig()
    image: ImageConfig = ImageConfig()
    serve: ServeSection = ServeSection()

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-gov)?-[a-z]+-\d", value):
            raise ValueError(f"'{value}' is not an AWS region name like us-east-1")
        return value

    @field_validator("cost_center", "owner", "environment")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("alert_email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        if value is not None and not _EMAIL.fullmatch(value):
            raise ValueError(f"'{value}' is not an e-mail address")
        return value

    @field_validator("extra_tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key in naming.COST_TAG_KEYS:
                raise ValueError(f"'{key}' is set by the program; set it through its own config key")
            if not _TAG_KEY.fullmatch(key) or key.lower().startswith("aws:"):
                raise ValueError(f"'{key}' is not a valid AWS tag key")
        return value

    @model_validator(mode="after")
    def _serve_fits(self) -> StackConfig:
        if not self.serve.enabled:
            return self
        if self.tier == "small":
            raise ValueError(
                "serve.enabled: the online endpoint runs on the EKS tiers (medium, large) only; the small tier's "
                "one Spot node is the nightly run's"
            )
        eks = self.eks
        pods = pods_on_head_group([*eks.ray_heads, *self.serve.ray_heads], karpenter=eks.karpenter_enabled)
        shortfall = head_group_shortfall(pods, shape_of(eks.head_instance_type), eks.head_nodes)
        if shortfall is not None:
            raise ValueError(
                f"serve.enabled: eks.head_instance_type {eks.head_instance_type} x eks.head_nodes {eks.head_nodes} "
                f"cannot hold the nightly RayJob's head and the RayService's head: {shortfall}; choose a larger "
                "eks.head_instance_type (m5.2xlarge), more eks.head_nodes or a smaller serve.head_size"
            )
        tp = self.job_config("s3://b/i/", "s3://b/o/").engine.tensor_parallel_size
        if self.serve.worker_size.gpus % tp:
            raise ValueError(
                f"serve.worker_size.gpus ({self.serve.worker_size.gpus}) is not a multiple of the job's "
                f"engine.tensor_parallel_size ({tp}): an engine must fit one replica's GPUs"
            )
        self.serve_config()  # a bad endpoint override stops here, before any resource
        return self

    def serve_config(self) -> ServeConfig:
        """The endpoint's config on the cluster: the nightly job's model and engine (its `job_config`), the
        stack's `serve.endpoint_overrides`, listening on every address of the head pod (the Service and the
        NetworkPolicy decide who reaches it), replicas between serve.min_replicas (at least 1 here: the
        RayService's autoscaling config takes it down to 0) and serve.max_replicas."""
        job = self.job_config("s3://unused/input/", "s3://unused/output/")
        overrides: dict[str, Any] = {f"serve.{key}": value for key, value in self.serve.endpoint_overrides.items()}
        overrides.update(
            {
                "device": "gpu",
                "replicas": max(self.serve.min_replicas, 1),
                "max_replicas": self.serve.max_replicas,
                "serve.host": "0.0.0.0",  # inside the pod; the NetworkPolicy admits the VPC only
                "serve.port": SERVE_PORT,
                "serve.haproxy": False,
                "serve.direct_streaming": False,
            }
        )
        try:
            return build_serve_config(job.model_dump(mode="json"), overrides)
        except ConfigError as error:
            raise ValueError(f"serve.endpoint_overrides: {error}") from None

    @classmethod
    def sections(cls) -> tuple[str, ...]:
        """The nested sections (`network`, `storage`, ...), in declaration order."""
        return tuple(
            name
            for name, field in cls.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        )

    def job_config(
        self, input_uri: str, output_uri: str, *, stack: str | None = None, price_per_hour_usd: float | None = None
    ) -> JobConfig:
        """The job's config for one run: the stack's model and overrides, reading and writing these URIs.

        `price_per_hour_usd` (from `infra.pricing.stack_costs.run_price_per_hour_usd`) prices the job's tokens
        unless the stack's own `metrics.price_per_hour_usd` override does.

        `stack` becomes the metrics' `Stack` dimension, which every alarm filters on, and names the log
        group the job's structured lines go to.
        """
        data: dict[str, Any] = copy.deepcopy(self.job.job_overrides)
        data["input"] = {**data.get("input", {}), "uri": input_uri}
        data["output"] = {**data.get("output", {}), "uri": output_uri}
        # A Spot replacement or a RayJob retry can start while the old attempt still commits under its lease:
        # wait for it (a lease lives resume.lease_ttl_s, 120 s by default) rather than fail the night.
        data["resume"] = {"lease_wait_s": NIGHTLY_LEASE_WAIT_S, **data.get("resume", {})}
        model = data.setdefault("model", {})
        if self.job.model_source is not None:
            model.setdefault("source", self.job.model_source)
        # Weights are cached on the node's disk (the image's /models volume), never baked into the image.
        model.setdefault("cache_dir", entrypoint.MODEL_CACHE_DIR)
        data.setdefault("device", "gpu")
        metrics = data.setdefault("metrics", {})
        metrics.setdefault("sink", "cloudwatch")
        metrics.setdefault("namespace", self.monitoring.metrics_namespace)
        metrics.setdefault("region", self.region)
        if "price_per_hour_usd" not in metrics and price_per_hour_usd is not None:
            metrics["price_per_hour_usd"] = price_per_hour_usd
        if stack is not None:
            metrics.setdefault("stack", stack)
            metrics.setdefault("log_group", naming.job_log_group(stack))
        return build_config(data)

    @property
    def job_grace_period_s(self) -> float:
        """The job's `resume.grace_period_s` (its override, else the job's default): SIGTERM to exit."""
        return ResumeConfig.model_validate(self.job.job_overrides.get("resume", {})).grace_period_s


# Only what differs between tiers; other fields take the model's default. Never mutated: copied per load.
TIER_DEFAULTS: dict[str, dict[str, Any]] = {
    "small": {
        "tier": "small",
        "cost": {"monthly_budget_usd": 400, "daily_report_threshold_usd": 20, "nightly_hours": 4},
    },
    "medium": {
        "tier": "medium",
        "network": {"interface_endpoints": ["ecr.api", "ecr.dkr", "sts", "logs"]},
        "eks": {"gpu_max_nodes": 2},
        "cost": {"monthly_budget_usd": 2500, "daily_report_threshold_usd": 120, "nightly_hours": 6},
    },
    "large": {
        "tier": "large",
        "network": {
            "az_count": 3,
            "single_nat_gateway": False,
            "interface_endpoints": ["ecr.api", "ecr.dkr", "sts", "logs"],
        },
        # Workers sized for the smallest type of the NodePool (g5.xlarge), so Karpenter can pick the cheapest.
        "eks": {
            "gpu_max_nodes": 8,
            "gpu_min_workers": 1,
            "karpenter_enabled": True,
            "worker_size": {"cpu": "3", "memory": "12Gi", "gpus": 1},
        },
        "cost": {"monthly_budget_usd": 15000, "daily_report_threshold_usd": 700, "nightly_hours": 8},
    },
}


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _format(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {NAMESPACE}:{key}: {item['msg']}")
    return "invalid stack config:\n" + "\n".join(lines)


def load_stack_config(stack: str, overrides: Mapping[str, Any]) -> StackConfig:
    """Merge the stack's `llm-batch:` config over its tier's defaults and validate the result.

    `overrides` maps keys without the namespace to values; sections are nested dicts. The tier comes from
    the `tier` key, or from the stack's name when that names a tier.
    """
    tier = overrides.get("tier", stack if stack in TIER_DEFAULTS else None)
    if tier is None:
        raise StackConfigError(f"invalid stack config:\n  {NAMESPACE}:tier: required for stack '{stack}'")
    if tier not in TIER_DEFAULTS:
        raise StackConfigError(
            f"invalid stack config:\n  {NAMESPACE}:tier: '{tier}' is not one of {sorted(TIER_DEFAULTS)}"
        )
    secrets = SECRET_KEYS.intersection(overrides)
    if secrets:
        raise StackConfigError(
            f"invalid stack config:\n  {NAMESPACE}:{sorted(secrets)[0]}: a secret; pass it to the component "
            "that needs it (pulumi config set --secret), not to the config model"
        )
    merged = _deep_merge(TIER_DEFAULTS[tier], overrides)
    try:
        return StackConfig.model_validate(merged)
    except ValidationError as error:
        raise StackConfigError(_format(error)) from None


def decode_pulumi_values(raw: Mapping[str, str]) -> dict[str, Any]:
    """`llm-batch:` config as Pulumi hands it to a program (strings; objects as JSON), without the namespace.

    Scalars stay strings and the model coerces them ("3" -> 3) so a string field keeps "0042" intact; objects
    and lists are decoded from JSON. Secret keys are left out; `aws:region` stands in for an unset `region`.
    """
    values: dict[str, Any] = {}
    # Pulumi users often set `aws:region`; honour it rather than deploy to the model's default region.
    aws_region = raw.get("aws:region")
    ours = raw.get(f"{NAMESPACE}:region")
    if aws_region and ours and aws_region != ours:
        raise StackConfigError(
            f"invalid stack config:\n  {NAMESPACE}:region: '{ours}' differs from aws:region '{aws_region}'; "
            "set one of them"
        )
    if aws_region and not ours:
        values["region"] = aws_region
    for full_key, value in raw.items():
        namespace, _, key = full_key.partition(":")
        if namespace != NAMESPACE or key in SECRET_KEYS:
            continue
        if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
            try:
                values[key] = json.loads(value)
            except json.JSONDecodeError as error:
                raise StackConfigError(f"invalid stack config:\n  {NAMESPACE}:{key}: bad JSON: {error}") from None
        else:
            values[key] = value
    return values


def from_pulumi() -> StackConfig:
    """The running stack's config: every `llm-batch:` key Pulumi passed to this program, read through pulumi.Config.

    Secret keys (the hub token) are not read here: their component reads them with `get_secret`, so they keep their
    marking. A bad config stops the program with `pulumi.RunError`, which Pulumi prints as one line, no traceback.
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    ours = pulumi.Config(NAMESPACE)
    # Only the key names come from the runtime's table: pulumi.Config has no listing, and an unknown (mistyped) key
    # must reach the model to be refused rather than be silently ignored.
    names = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw: dict[str, str] = {}
    for full_key in names:
        namespace, _, key = full_key.partition(":")
        if namespace == NAMESPACE and key not in SECRET_KEYS and (value := ours.get(key)) is not None:
            raw[full_key] = value
    if (aws_region := pulumi.Config("aws").get("region")) is not None:
        raw["aws:region"] = aws_region
    try:
        return load_stack_config(pulumi.get_stack(), decode_pulumi_values(raw))
    except StackConfigError as error:
        head, *items = (line.strip() for line in str(error).splitlines())
        raise pulumi.RunError(f"{head} {'; '.join(items)}" if items else head) from None
