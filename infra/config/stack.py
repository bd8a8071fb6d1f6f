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
import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from infra import naming
from infra.config.eks import EightGpuWorkers, EksConfig, ServeSection
from infra.config.regional_types import with_offered_types
from infra.config.sections import (
    _EMAIL,
    _TAG_KEY,
    NAMESPACE,
    NIGHTLY_LEASE_WAIT_S,
    SECRET_KEYS,
    BatchApiSection,
    CostConfig,
    ImageConfig,
    JobSection,
    MonitoringConfig,
    NetworkConfig,
    ScheduleConfig,
    SmallConfig,
    StackConfigError,
    StorageConfig,
    Tier,
    _Section,
)
from infra.config.worker_groups import WorkerGroup, choose_group, worker_groups
from infra.k8s.head_group import head_group_shortfall, pods_on_head_group
from infra.k8s.instance_types import SHAPES, shape_of
from infra.k8s.model_disk import disk_problem
from infra.k8s.network_policy import SERVE_PORT
from workload.contract import entrypoint
from workload.contract.config import ConfigError, JobConfig, ResumeConfig, build_config
from workload.contract.serve_config import ServeConfig, build_serve_config


class StackConfig(_Section):
    tier: Tier = Field(description="Which tier's defaults apply.")
    region: str = Field("us-east-1", description="AWS region of every resource (billing metrics: us-east-1).")
    cost_center: str = Field(description="The CostCenter cost-allocation tag; required.")
    owner: str = Field("ml-platform", description="The Owner tag: who answers for this stack.")
    environment: str = Field("production", description="The Environment tag.")
    alert_email: str | None = Field(None, description="E-mail subscribed to the alerts topic.")
    policy_pack_required: bool = Field(
        False,
        description="A real `pulumi up` stops unless the policy pack (infra/policy_pack) is attached through "
        "PULUMI_OPTION_POLICY_PACK (infra/deploy_route.py).",
    )
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
    batch_api: BatchApiSection = BatchApiSection()

    @model_validator(mode="before")
    @classmethod
    def _eight_gpu_types_of_the_region(cls, data: Any) -> Any:
        # Before validation, so the pools' one list of types is what every check and the estimate see.
        wide = EightGpuWorkers.model_fields
        return with_offered_types(
            data,
            default_region=cls.model_fields["region"].default,
            default_pool=wide["node_pool"].default.model_dump(),
            default_offered=wide["where_offered"].default,
        )

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

    @property
    def zone_instance_types(self) -> tuple[list[str], list[str]]:
        """(types every subnet's zone must offer, types a zone is preferred for offering) (infra/zones.py)."""
        serve = [self.serve.instance_type] if self.serve.enabled and self.tier != "small" else []
        if self.tier == "small":
            return [self.small.instance_type], []
        if self.eks.karpenter_enabled:
            first, *others = self.night_workers.node_pool.instance_types
            return [first, self.eks.head_instance_type, self.eks.system_instance_type], [*others, *serve]
        return [self.eks.gpu_instance_type, self.eks.head_instance_type, self.eks.system_instance_type], serve

    @model_validator(mode="after")
    def _public_subnets_small_only(self) -> StackConfig:
        if self.network.egress == "public_subnets" and self.tier != "small":
            raise ValueError(
                "network.egress: public_subnets is for the small tier's one node; EKS nodes stay in private "
                "subnets behind nat_instance or nat_gateway"
            )
        return self

    @property
    def model_nodes(self) -> list[tuple[str, str, int]]:
        """(config key, instance type, root volume GiB) of every GPU node that holds a copy of the model."""
        if self.tier == "small":
            return [("small.instance_type", self.small.instance_type, self.small.root_volume_gib)]
        eks = self.eks
        if eks.karpenter_enabled:
            group = self.night_workers
            key = f"{group.key}.instance_types"
            nodes = [(key, t, eks.node_volume_gib) for t in group.node_pool.instance_types]
        else:
            nodes = [("eks.gpu_instance_type", eks.gpu_instance_type, eks.node_volume_gib)]
        if self.serve.enabled:
            nodes.append(("serve.instance_type", self.serve.instance_type, eks.node_volume_gib))
        return nodes

    @property
    def night_workers(self) -> WorkerGroup:
        """The GPU worker group the nightly run uses: on Karpenter's tier, the one the model's engine needs
        (infra/config/worker_groups.py); elsewhere the one GPU group."""
        engine = self.job_config("s3://b/i/", "s3://b/o/").engine
        groups = worker_groups(self.eks)
        return choose_group(
            groups, engine.tensor_parallel_size, self.job.model_weights_gib, engine.gpu_memory_utilization
        )

    @model_validator(mode="after")
    def _night_has_a_group(self) -> StackConfig:
        if self.tier != "small":
            self.night_workers  # noqa: B018 -- a tensor-parallel size or model no group can run stops here
        return self

    @model_validator(mode="after")
    def _model_fits_node_disk(self) -> StackConfig:
        weights = self.job.model_weights_gib
        if self.tier != "small" and self.job.model_source is not None and weights is None:
            raise ValueError(
                "job.model_weights_gib is required with job.model_source on the EKS tiers: it sizes the GPU "
                "workers' /models volume; set it to the weights_gib that `python -m workload engine-plan --model "
                f"{self.job.model_source} --gpu <kind>` prints"
            )
        for key, instance_type, root_volume_gib in self.model_nodes:
            if problem := disk_problem(weights, instance_type, root_volume_gib):
                raise ValueError(f"job.model_weights_gib: {problem} ({key}); choose a type with more disk")
        return self

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
        pods = pods_on_head_group([*eks.ray_heads, *self.serve.ray_heads])
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

    def serve_config(self, api_keys_secret_arn: str | None = None) -> ServeConfig:
        """The endpoint's config on the cluster: the nightly job's model and engine (its `job_config`), the
        stack's `serve.endpoint_overrides`, listening on every address of the head pod (the Service and the
        NetworkPolicy decide who reaches it), replicas between serve.min_replicas (at least 1 here: the
        RayService's autoscaling config takes it down to 0) and serve.max_replicas; its API keys in the secret
        `api_keys_secret_arn` (known once the stack has created it)."""
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
                "serve.api_key_secret": api_keys_secret_arn,
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
        """The job's config for one run: the stack's model and overrides, reading and writing these URIs; with
        `job.image_prefix`, images under that prefix of the input's bucket (the stack's own).

        `price_per_hour_usd` (from `infra.pricing.stack_costs.run_price_per_hour_usd`) prices the job's tokens
        unless the stack's own `metrics.price_per_hour_usd` override does.

        `stack` becomes the metrics' `Stack` dimension, which every alarm filters on, and names the log
        group the job's structured lines go to.
        """
        data: dict[str, Any] = copy.deepcopy(self.job.job_overrides)
        data["input"] = {**data.get("input", {}), "uri": input_uri}
        if self.job.image_prefix is not None:
            data["input"]["image_prefix"] = images_uri(input_uri, self.job.image_prefix)
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
        if self.tier == "small" and "replicas" not in data:
            data["replicas"] = self.small_engines(data)
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

    def small_engines(self, job: dict[str, Any]) -> int:
        """Engines on the small tier's one node: its GPUs / the job's tensor_parallel_size (a g5.12xlarge's four
        GPUs run four engines, or two at TP 2), so no GPU of the node idles. A type outside the shapes table gets
        the one engine it always had."""
        shape = SHAPES.get(self.small.instance_type)
        tp = int(job.get("engine", {}).get("tensor_parallel_size", 1))
        if shape is None:
            return 1
        if shape.gpus % tp or tp > shape.gpus:
            raise ValueError(
                f"job.engine.tensor_parallel_size ({tp}) does not divide the {shape.gpus} GPUs of "
                f"small.instance_type {self.small.instance_type}: an engine must fit the node's GPUs, all of them used"
            )
        return shape.gpus // tp

    @property
    def job_grace_period_s(self) -> float:
        """The job's `resume.grace_period_s` (its override, else the job's default): SIGTERM to exit."""
        return ResumeConfig.model_validate(self.job.job_overrides.get("resume", {})).grace_period_s


def images_uri(input_uri: str, image_prefix: str) -> str:
    """`job.image_prefix` in the input's bucket: the stack's bucket, where every run's input is (`s3://b/input/`,
    `images/` -> `s3://b/images/`)."""
    if not input_uri.startswith("s3://"):
        raise ValueError(f"job.image_prefix needs the input in the stack's bucket (s3://...), not {input_uri!r}")
    bucket = input_uri.removeprefix("s3://").split("/", 1)[0]
    return f"s3://{bucket}/{image_prefix}"


# Only what differs between tiers; other fields take the model's default. Never mutated: copied per load.
TIER_DEFAULTS: dict[str, dict[str, Any]] = {
    # No interface endpoints: at these volumes each costs more a month (7.30 USD per zone) than the NAT instance
    # it would spare traffic from; S3 (models, data, ECR's layers) has its gateway endpoint (docs/cost.md).
    "small": {
        "tier": "small",
        "network": {"egress": "public_subnets"},
        "cost": {"monthly_budget_usd": 400, "daily_report_threshold_usd": 20, "nightly_hours": 4},
    },
    "medium": {
        "tier": "medium",
        "eks": {"gpu_max_nodes": 2},
        "cost": {"monthly_budget_usd": 2500, "daily_report_threshold_usd": 120, "nightly_hours": 6},
    },
    "large": {
        "tier": "large",
        # A NAT instance per zone: a zone's outage stays in the zone, for 7.36 USD a month each.
        "network": {"az_count": 3, "single_nat_gateway": False},
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
