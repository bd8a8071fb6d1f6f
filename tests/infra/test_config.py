"""The stack config model: tier defaults, stack overrides, and errors that name the bad key."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from infra.config import (
    StackConfig,
    StackConfigError,
    decode_pulumi_values,
    load_stack_config,
)
from infra.config.stack import TIER_DEFAULTS
from infra.ops.stacks import read_stack_config, stack_file
from tests.infra.conftest import STACKS
from workload.contract.config import ConfigError, load_config

BASE = {"tier": "small", "cost_center": "ml-platform"}


def _load(**overrides: Any) -> StackConfig:
    return load_stack_config("test", {**BASE, **overrides})


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_file_is_valid(stack: str) -> None:
    values, _ = read_stack_config(stack)
    config = load_stack_config(stack, decode_pulumi_values(values))
    # A tier's own stack is named after it; a model's stack on a tier is `<tier>-<model>` (large-70b).
    assert config.tier == stack.split("-")[0]
    assert config.cost_center


def test_tier_defaults_apply_and_differ() -> None:
    small = load_stack_config("s", {**BASE, "tier": "small"})
    medium = load_stack_config("m", {**BASE, "tier": "medium"})
    large = load_stack_config("l", {**BASE, "tier": "large"})
    assert [c.cost.monthly_budget_usd for c in (small, medium, large)] == [400, 2500, 15000]
    assert small.small.instance_type == "g5.xlarge" and small.small.root_volume_gib == 200
    assert small.network.interface_endpoints == [] and small.network.single_nat_gateway
    # No interface endpoints by default (docs/cost.md); small's node sits in public subnets, the EKS tiers' behind
    # NAT instances.
    assert medium.network.interface_endpoints == [] and large.network.interface_endpoints == []
    assert small.network.egress == "public_subnets" and small.network.nat_count == 0
    assert medium.network.egress == large.network.egress == "nat_instance"
    assert medium.network.nat_count == 1 and large.network.nat_count == 3
    assert not medium.eks.karpenter_enabled and large.eks.karpenter_enabled
    assert large.network.az_count == 3 and not large.network.single_nat_gateway
    assert small.storage.glacier_after_days == 30
    assert small.schedule.cron == "cron(0 1 * * ? *)"
    # One tick of the Batch API's queue at a time on every tier (issue 59, finding 5).
    assert {c.batch_api.tick_reserved_concurrency for c in (small, medium, large)} == {1}


def test_tier_from_stack_name_when_not_set() -> None:
    assert load_stack_config("medium", {"cost_center": "x"}).tier == "medium"


def test_overrides_merge_into_sections_without_mutating_defaults() -> None:
    before = copy.deepcopy(TIER_DEFAULTS)
    config = load_stack_config("l", {**BASE, "tier": "large", "network": {"az_count": 4}, "eks": {"gpu_max_nodes": 3}})
    assert config.network.az_count == 4
    assert config.network.single_nat_gateway is False  # kept from the tier
    assert config.eks.gpu_max_nodes == 3 and config.eks.karpenter_enabled
    assert before == TIER_DEFAULTS


def test_pulumi_strings_are_coerced_and_objects_decoded() -> None:
    raw = {
        "llm-batch:tier": "small",
        "llm-batch:cost_center": "0042",
        "llm-batch:network": '{"az_count": 3, "single_nat_gateway": false}',
        "llm-batch:storage": '{"glacier_after_days": "45"}',
        "llm-batch:hub_token": "hf_secret",
        "aws:region": "eu-west-1",
    }
    values = decode_pulumi_values(raw)
    assert "hub_token" not in values and values["region"] == "eu-west-1"
    config = load_stack_config("small", values)
    assert config.cost_center == "0042"
    assert config.network.az_count == 3 and config.network.single_nat_gateway is False
    assert config.storage.glacier_after_days == 45


def test_bad_json_object_names_the_key() -> None:
    with pytest.raises(StackConfigError, match="llm-batch:network: bad JSON"):
        decode_pulumi_values({"llm-batch:network": "{az_count: 3"})


def test_secret_keys_never_enter_the_model() -> None:
    with pytest.raises(StackConfigError, match="llm-batch:hub_token: a secret"):
        _load(hub_token="hf_abc")


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        ({"cost_center": None}, "llm-batch:cost_center", "string"),
        ({"cost_center": "  "}, "llm-batch:cost_center", "must not be empty"),
        ({"tier": "huge"}, "llm-batch:tier", "'huge' is not one of"),
        ({"region": "mars-1"}, "llm-batch:region", "not an AWS region"),
        ({"alert_email": "oncall"}, "llm-batch:alert_email", "not an e-mail address"),
        ({"extra_tags": {"CostCenter": "x"}}, "llm-batch:extra_tags", "set by the program"),
        ({"extra_tags": {"aws:foo": "x"}}, "llm-batch:extra_tags", "not a valid AWS tag key"),
        ({"network": {"az_count": 1}}, "llm-batch:network.az_count", "greater than or equal to 2"),
        ({"network": {"nat": True}}, "llm-batch:network.nat", "Extra inputs are not permitted"),
        ({"network": {"vpc_cidr": "10.0.0.0/8"}}, "llm-batch:network.vpc_cidr", "between /16 and /22"),
        ({"network": {"vpc_cidr": "nope"}}, "llm-batch:network.vpc_cidr", "not a CIDR block"),
        ({"network": {"existing_vpc_id": "vpc-1"}}, "llm-batch:network", "set both or neither"),
        (
            {"network": {"existing_vpc_id": "vpc-1", "existing_private_subnet_ids": ["subnet-1"]}},
            "llm-batch:network",
            "at least two zones",
        ),
        (
            {"network": {"interface_endpoints": ["s3"]}},
            "llm-batch:network.interface_endpoints.0",
            "Input should be",
        ),
        (
            {"network": {"interface_endpoints": ["sts", "sts"]}},
            "llm-batch:network.interface_endpoints",
            "twice",
        ),
        ({"storage": {"glacier_after_days": 0}}, "llm-batch:storage.glacier_after_days", "greater than"),
        ({"storage": {"noncurrent_expire_days": 10}}, "llm-batch:storage", "more than glacier_after_days"),
        ({"small": {"root_volume_gib": 8}}, "llm-batch:small.root_volume_gib", "greater than or equal to 50"),
        ({"small": {"max_spot_price": -1}}, "llm-batch:small.max_spot_price", "greater than 0"),
        (
            {"eks": {"endpoint_public_access_cidrs": ["0.0.0.0/0"]}},
            "llm-batch:eks.endpoint_public_access_cidrs",
            "opens the API server",
        ),
        ({"schedule": {"cron": "0 1 * * *"}}, "llm-batch:schedule.cron", "EventBridge Scheduler expression"),
        ({"job": {"input_prefix": "s3://b/in/"}}, "llm-batch:job.input_prefix", "key prefix inside the data"),
        ({"job": {"job_overrides": {"output": {}}}}, "llm-batch:job.job_overrides", "comes from the bucket"),
        (
            {"monitoring": {"error_ratio_max": 2}},
            "llm-batch:monitoring.error_ratio_max",
            "less than or equal",
        ),
        ({"cost": {"monthly_budget_usd": 0}}, "llm-batch:cost.monthly_budget_usd", "greater than 0"),
        (
            {"batch_api": {"tick_reserved_concurrency": 0}},
            "llm-batch:batch_api.tick_reserved_concurrency",
            "greater than or equal to 1",
        ),
        (
            {"batch_api": {"tick_reserved_concurrency": "two"}},
            "llm-batch:batch_api.tick_reserved_concurrency",
            "valid integer",
        ),
        ({"batch_api": {"quotas": {"max_n": 0}}}, "llm-batch:batch_api.quotas.max_n", "greater than or equal to 1"),
        ({"batch_api": {"quotas": {"open_batchs": 5}}}, "llm-batch:batch_api.quotas.open_batchs", "Extra inputs"),
        (
            {"batch_api": {"http_reserved_concurrency": 0}},
            "llm-batch:batch_api.http_reserved_concurrency",
            "greater than or equal to 1",
        ),
    ],
)
def test_bad_config_names_the_key(overrides: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(StackConfigError) as caught:
        _load(**overrides)
    text = str(caught.value)
    assert f"{key}: " in text and message in text, text


def test_config_is_frozen() -> None:
    config = _load()
    with pytest.raises(ValidationError):
        config.region = "eu-west-1"  # type: ignore[misc]


def test_job_config_renders_what_the_job_loads(tmp_path: Any) -> None:
    config = _load(
        job={
            "model_source": "Qwen/Qwen2.5-0.5B-Instruct",
            "job_overrides": {"engine": {"max_num_seqs": 256}, "sampling": {"max_tokens": 128}},
        }
    )
    job = config.job_config("s3://b/input/{date}/", "s3://b/output/{date}/", stack="small")
    assert job.input.uri == "s3://b/input/{date}/" and job.output.uri == "s3://b/output/{date}/"
    assert job.model.source == "Qwen/Qwen2.5-0.5B-Instruct"
    assert job.device == "gpu" and job.engine.max_num_seqs == 256 and job.sampling.max_tokens == 128
    assert job.metrics.sink == "cloudwatch" and job.metrics.stack == "small"
    assert job.resume.lease_wait_s == 300  # a replacement waits out the old attempt's lease
    assert job.metrics.namespace == config.monitoring.metrics_namespace
    from workload.contract.config import render_config

    path = tmp_path / "job.yaml"
    path.write_text(render_config(job))
    assert load_config(path) == job


def test_job_overrides_are_validated_by_the_job_model() -> None:
    config = _load(job={"job_overrides": {"engine": {"max_num_seqs": 0}}})
    with pytest.raises(ConfigError, match=r"engine\.max_num_seqs"):
        config.job_config("s3://b/in/", "s3://b/out/")


def test_stack_files_hold_only_differences() -> None:
    for stack in STACKS:
        document = yaml.safe_load(stack_file(stack).read_text())
        tier = document["config"]["llm-batch:tier"]
        defaults = load_stack_config(stack, {"tier": tier, "cost_center": "-"}).model_dump()
        for key, value in document["config"].items():
            name = key.split(":", 1)[1]
            if name == "tier" or not key.startswith("llm-batch:"):
                continue
            leaves = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, leaf in leaves:
                default = defaults[name] if sub is None else defaults[name][sub]
                assert leaf != default, f"{stack}: {key} {sub or ''} repeats the tier default"


def test_config_reference_documents_every_shared_key() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "config-reference.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", readme, flags=re.MULTILINE))
    shared_sections = ("network", "storage", "small", "job")
    expected = {name for name in StackConfig.model_fields if name not in StackConfig.sections()}
    for section in shared_sections:
        model = StackConfig.model_fields[section].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        expected |= {f"{section}.{key}" for key in model.model_fields}
    assert expected - documented == set(), "docs/config-reference.md's stack config table misses keys"


def test_region_from_aws_region_unless_they_disagree() -> None:
    assert "region" not in decode_pulumi_values({"llm-batch:tier": "small"})
    same = {"aws:region": "eu-west-1", "llm-batch:region": "eu-west-1"}
    assert decode_pulumi_values(same)["region"] == "eu-west-1"
    with pytest.raises(StackConfigError, match="llm-batch:region: 'us-east-1' differs from aws:region 'eu-west-1'"):
        decode_pulumi_values({"aws:region": "eu-west-1", "llm-batch:region": "us-east-1"})


def test_the_small_tier_runs_an_engine_per_gpu_group_of_its_node() -> None:
    """A multi-GPU small node uses every GPU: engines = GPUs / tensor_parallel_size; a TP that does not divide
    the node's GPUs stops the config."""
    from infra.config import load_stack_config

    def engines(instance_type: str, tp: int) -> int:
        config = load_stack_config(
            "small",
            {
                "cost_center": "cc",
                "small": {"instance_type": instance_type},
                "job": {"job_overrides": {"engine": {"tensor_parallel_size": tp}}},
            },
        )
        return config.job_config("s3://b/i/", "s3://b/o/").replicas

    assert engines("g5.xlarge", 1) == 1
    assert engines("g5.12xlarge", 1) == 4 and engines("g5.12xlarge", 2) == 2
    assert engines("g5.48xlarge", 8) == 1
    with pytest.raises(ValueError, match=r"does not divide the 4 GPUs of small\.instance_type g5\.12xlarge"):
        engines("g5.12xlarge", 3)
