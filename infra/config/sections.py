"""The stack config's sections other than the EKS cluster's: network, storage, the small tier's node, the nightly
schedule, the job, monitoring, cost and the image. Each is a frozen pydantic model whose unknown keys are errors.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra import versions
from monitoring.alarms import AlarmThresholds
from workload.contract.batch_api_quotas import BatchApiQuotas
from workload.contract.config import DEFAULT_METRICS_NAMESPACE

Tier = Literal["small", "medium", "large"]
# How private nodes reach the internet's HTTPS (docs/cost.md weighs them): a NAT instance (a few dollars a month),
# NAT gateways (about 37 USD a month each, for egress heavier than an instance carries), or, for the small tier's
# one node, no NAT at all: the node sits in a public subnet with no inbound rule and a public address only while
# it runs.
Egress = Literal["nat_instance", "nat_gateway", "public_subnets"]
InterfaceEndpoint = Literal["ecr.api", "ecr.dkr", "sts", "logs", "ssm", "ssmmessages", "ec2messages", "monitoring"]

NAMESPACE = "llm-batch"
# Config keys read as Pulumi secrets by the component that needs them, never part of the (printable) model.
SECRET_KEYS = frozenset({"hub_token"})

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TAG_KEY = re.compile(r"^[\w .:/=+@-]{1,128}$")


# The bucket's prefixes the stack writes for itself (infra/components/storage.py MODEL_PREFIX and CHECKPOINT_PREFIX,
# bucket_retention.py CONTROL_PREFIX, batch_api.py API_PREFIX; tests/infra/test_job_image_prefix.py holds them
# equal): job.image_prefix may not cover any of them. Spelled here because infra/config imports no component.
STACK_PREFIXES = ("models/", "checkpoints/", "control/", "batch-api/")

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
    egress: Egress = Field(
        "nat_instance",
        description="How nodes reach HTTPS outside the VPC: nat_instance (one small instance per NAT, egress "
        "443 only), nat_gateway, or public_subnets (small tier only: the node in a public subnet, no inbound "
        "rule, a public IPv4 only while it runs). S3 always goes through the gateway endpoint.",
    )
    nat_instance_type: str = Field(
        "t4g.nano",
        description="Instance type of each NAT instance (egress: nat_instance); Graviton (…g.) types boot the "
        "arm64 image. Models and data come through the S3 gateway endpoint, so the NAT carries API calls.",
    )
    single_nat_gateway: bool = Field(
        True, description="One NAT (gateway or instance) for all zones (cheaper) instead of one per zone."
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

    @property
    def nat_count(self) -> int:
        """NATs the program creates (gateways or instances): none in an existing VPC or with public subnets."""
        if not self.create_vpc or self.egress == "public_subnets":
            return 0
        return 1 if self.single_nat_gateway else self.az_count

    @field_validator("nat_instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", value):
            raise ValueError(f"{value!r} is not an EC2 instance type like t4g.nano")
        return value


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
    model_weights_gib: float | None = Field(
        None,
        gt=0,
        description="The model's weights in GiB: `weights_gib` of `python -m workload engine-plan --model <source> "
        "--gpu <kind>`. Sizes the GPU workers' /models volume and is checked to fit the nodes' disk; required "
        "with model_source on the EKS tiers. None: the embedded tiny model's.",
    )
    input_prefix: str = Field("input/{date}/", description="Key prefix of a run's prompts; {date} is the run's.")
    output_prefix: str = Field("output/{date}/", description="Key prefix of a run's results.")
    image_prefix: str | None = Field(
        None,
        description="Key prefix in the stack's bucket the nightly job may read images from (the job's "
        "input.image_prefix, s3://<bucket>/<this>), e.g. 'images/'; the job's role may read it and no wider. A "
        "fixed prefix, no {date}. None: the nightly job takes `data:` URLs only. A Batch API batch never reads it.",
    )
    job_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Merged into the job's workload.contract.config.JobConfig (nested keys)."
    )

    @field_validator("input_prefix", "output_prefix")
    @classmethod
    def _relative_prefix(cls, value: str) -> str:
        if value.startswith("/") or "://" in value or not value.endswith("/"):
            raise ValueError("must be a key prefix inside the data bucket, ending in '/', e.g. 'input/{date}/'")
        return value

    @field_validator("image_prefix")
    @classmethod
    def _fixed_prefix(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.startswith("/") or "://" in value or not value.endswith("/") or value == "/":
            raise ValueError("must be a key prefix inside the data bucket, ending in '/', e.g. 'images/'")
        if "{" in value or "*" in value or "?" in value:
            raise ValueError("must be a fixed key prefix (no {date}, no wildcards): the job's role may read it only")
        return value

    @field_validator("job_overrides")
    @classmethod
    def _no_locations(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("input", "output"):
            if key in value:
                raise ValueError(f"'{key}' comes from the bucket and {key}_prefix, not from job_overrides")
        return value

    @model_validator(mode="after")
    def _images_apart(self) -> JobSection:
        """The images' prefix holds only what the nightly job may show a model: none of the stack's own keys (its
        outputs, models, checkpoints, run requests, the Batch API's tenants' files) may be under it or over it."""
        image = self.image_prefix
        if image is None:
            return self
        output = self.output_prefix.split("{", 1)[0]
        for other, what in ((output, "job.output_prefix"), *((p, "the stack's own keys") for p in STACK_PREFIXES)):
            if other and (image.startswith(other) or other.startswith(image)):
                raise ValueError(
                    f"job.image_prefix {image!r} overlaps {other!r} ({what}): give the images a prefix of their own"
                )
        return self


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
    boot_minutes: float = Field(
        15,
        ge=0,
        le=120,
        description="Minutes a night each node runs before it decodes (boot, image pull, model fetch), for estimates.",
    )
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


class BatchApiSection(_Section):
    """The OpenAI-compatible Batch API's AWS front (docs/batch-api.md, "On the AWS tiers")."""

    enabled: bool = Field(
        False,
        description="Serve the Batch API: an API Gateway HTTP API and a Lambda function over the stack's bucket, "
        "its queue run on the nightly state machine. Off: none of it exists.",
    )
    public_endpoint_acknowledged: bool = Field(
        False,
        description="An HTTP API is always reachable from the internet (behind the Batch API's own keys, "
        "`llm-batch-<stack>/batch-api-keys`); the policy gate refuses an enabled Batch API until this says the "
        "stack accepts that.",
    )
    tick_minutes: int = Field(
        5, ge=1, le=60, description="Minutes between the queue's ticks (start, follow, expire, sweep batches)."
    )
    memory_mb: int = Field(
        1024, ge=256, le=10240, description="The function's memory (Lambda gives CPU in proportion to it)."
    )
    tick_reserved_concurrency: int = Field(
        1,
        ge=1,
        le=10,
        description="Reserved concurrent executions of the tick function: 1 runs one tick at a time, so the "
        "schedule's tick, the nightly enqueue and the machine's NextBatch never overlap (a throttled scheduled "
        "tick waits in Lambda's asynchronous queue; NextBatch retries a throttle). 0 is refused: it would "
        "throttle every tick.",
    )
    http_reserved_concurrency: int = Field(
        20,
        ge=1,
        le=1000,
        description="Reserved concurrent executions of the HTTP function: the most requests served at once, so a "
        "flood of one key's calls cannot take the account's Lambda concurrency from its other functions (nor "
        "theirs this one's). Preflight checks both reservations against the account's quota, of which AWS keeps "
        "100 unreserved.",
    )
    pool_batches: int = Field(
        4,
        ge=1,
        le=16,
        description="Queued batches of one endpoint that share one run of the job and its engine (docs/batch-api.md, "
        "'Several batches on one engine'); each keeps its own output and closes when its rows are done. 1: each "
        "batch runs alone.",
    )
    quotas: BatchApiQuotas = Field(
        default_factory=BatchApiQuotas,
        description="What one key may hold (batches open and their requests, files and bytes, Uploads and parts) "
        "and how large a request may ask (n, max_tokens): a 429 or 400 past them (docs/batch-api.md, 'Quotas'); "
        "and each key's queue priority (priorities: key name -> -100..100, larger first; docs/batch-api.md, "
        "'Priorities and deadlines').",
    )
