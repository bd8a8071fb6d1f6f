"""`llm-batch:job.image_prefix` (issue 57): the prefix of the stack's own (KMS-encrypted) bucket the nightly job may
read images from. Checked at three levels: the config model refuses a prefix that is not one (naming the key); the
nightly job's config on every tier carries it as `input.image_prefix` (small: the settings the node's user data
fetches; medium and large: the RayJob the submit function renders from the `rayjob_args` export), and a Batch API
batch's run drops it; the job's role may read that prefix and nothing more of the bucket. The plans come from the
Pulumi program under mocks, the only way to run it here (no CLI, no AWS account).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pulumi
import pytest
import yaml

from infra.components.batch_api import API_PREFIX
from infra.components.bucket_retention import CONTROL_PREFIX
from infra.components.secrets import JobSecrets, JobSecretsArgs
from infra.components.storage import CHECKPOINT_PREFIX, MODEL_PREFIX
from infra.config import StackConfigError, load_stack_config
from infra.config.sections import STACK_PREFIXES
from infra.eks_job import night_manifests
from infra.k8s import rayjob
from infra.ops.plan import capture_plan
from tests.infra.component_mocks import register
from workload.contract.config import load_config

Plan = list[dict[str, Any]]
IMAGES = "images/"
ON = {"job.image_prefix": IMAGES}


def _config(tier: str, **job: Any) -> Any:
    return load_stack_config(tier, {"cost_center": "cc", "job": job})


@pytest.mark.parametrize("tier", ["small", "medium", "large"])
def test_the_nightly_job_reads_images_under_the_prefix_in_the_stacks_bucket(tier: str) -> None:
    job = _config(tier, image_prefix=IMAGES).job_config("s3://data/input/{date}/", "s3://data/output/{date}/")
    assert job.input.image_prefix == "s3://data/images/"
    assert _config(tier).job_config("s3://data/i/", "s3://data/o/").input.image_prefix is None  # data: URLs only


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        ("/images/", "key prefix inside the data bucket"),
        ("s3://other/images/", "key prefix inside the data bucket"),
        ("images", "ending in '/'"),
        ("/", "key prefix inside the data bucket"),
        ("images/{date}/", "fixed key prefix"),
        ("images/*/", "fixed key prefix"),
        ("output/", "overlaps 'output/' \\(job.output_prefix\\)"),
        ("output/images/", "overlaps 'output/'"),
        ("models/", "overlaps 'models/' \\(the stack's own keys\\)"),
        ("batch-api/files/", "overlaps 'batch-api/'"),
        ("control/", "overlaps 'control/'"),
        ("checkpoints/x/", "overlaps 'checkpoints/'"),
    ],
)
def test_a_prefix_that_is_not_the_images_own_is_refused_naming_the_key(prefix: str, why: str) -> None:
    with pytest.raises(StackConfigError, match=r"job\.image_prefix") as raised:
        _config("small", image_prefix=prefix)
    assert raised.match(why)


def test_the_stack_prefixes_the_images_keep_out_of_are_the_components() -> None:
    # infra/config imports no component, so it spells them; this holds the two spellings equal.
    assert set(STACK_PREFIXES) == {MODEL_PREFIX, CHECKPOINT_PREFIX, CONTROL_PREFIX, API_PREFIX}


def test_small_the_settings_the_node_fetches_carry_the_prefix() -> None:
    """The settings secret's value (masked in the plan) as the program renders it for the node's user data."""
    settings: list[str] = []

    def build() -> None:
        config = _config("small", image_prefix=IMAGES)
        args = JobSecretsArgs.from_config(
            "small", config, "arn:aws:kms:us-east-1:123456789012:key/k", pulumi.Output.from_input("data-bucket")
        )
        pulumi.Output.from_input(args.job_settings).apply(settings.append)
        JobSecrets("secrets", args)

    register(build)
    (text,) = settings
    job = yaml.safe_load(text)
    assert job["input"]["image_prefix"] == "s3://data-bucket/images/"


def _job_policy(plan: Plan) -> dict[str, Any]:
    (policy,) = [
        item
        for item in plan
        if item["type"] == "aws:iam/policy:Policy" and str(item["inputs"].get("name", "")).endswith("-job")
    ]
    return dict(json.loads(policy["inputs"]["policy"]))


def _bucket_arn(plan: Plan) -> str:
    (bucket,) = [item for item in plan if item["type"] == "aws:s3/bucket:Bucket" and item["name"] == "storage-bucket"]
    return str(bucket["outputs"]["arn"])


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {tier: capture_plan(tier, ON) for tier in ("small", "medium")}


@pytest.mark.parametrize("tier", ["small", "medium"])
def test_the_job_role_reads_the_images_prefix_and_no_more(plans: dict[str, Plan], tier: str) -> None:
    plan = plans[tier]
    statements = {s["Sid"]: s for s in _job_policy(plan)["Statement"]}
    bucket = _bucket_arn(plan)
    reads = statements["ReadInputsModelsAndOwnOutputs"]["Resource"]
    assert f"{bucket}/{IMAGES}*" in reads
    assert all(resource.startswith(f"{bucket}/") and resource != f"{bucket}/*" for resource in reads)
    assert f"{IMAGES}*" in statements["ListOwnPrefixes"]["Condition"]["StringLike"]["s3:prefix"]
    # Read only: never written, never deleted.
    assert not any(IMAGES in resource for resource in statements["WriteOutputsAndCheckpoints"]["Resource"])


def test_without_the_key_the_job_role_reads_no_images_prefix(plan_for: Callable[[str], Plan]) -> None:
    (reads,) = [s for s in _job_policy(plan_for("small"))["Statement"] if s["Sid"] == "ReadInputsModelsAndOwnOutputs"]
    assert not any(IMAGES in resource for resource in reads["Resource"])


def test_eks_the_nightly_rayjob_carries_the_prefix(plans: dict[str, Plan]) -> None:
    (stack,) = [item for item in plans["medium"] if item["type"] == "pulumi:pulumi:Stack"]
    args = rayjob.RayJobArgs.model_validate_json(stack["outputs"]["rayjob_args"])
    bucket = args.job.input.uri.removeprefix("s3://").split("/", 1)[0]
    assert args.job.input.image_prefix == f"s3://{bucket}/{IMAGES}"
    manifests = night_manifests(
        args, run_id="20261207t0100", input_uri=f"s3://{bucket}/input/2026-12-07/", output_uri=f"s3://{bucket}/o/"
    )
    (config_map,) = [m for m in manifests if m["kind"] == "ConfigMap"]
    night = yaml.safe_load(config_map["data"][rayjob.CONFIG_FILE])
    assert night["input"]["image_prefix"] == f"s3://{bucket}/{IMAGES}"


def test_a_batch_run_on_a_tier_reads_no_image_prefix(tmp_path: Any) -> None:
    """The flag both tiers give a Batch API batch's run (user data, the submit function): the job's config then
    has no image prefix, whatever the night's settings say."""
    import argparse

    from workload.cli.commands import add_config_flags, load_job_config

    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    add_config_flags(parser)
    config = _config("small", image_prefix=IMAGES).job_config("s3://data/input/x/", "s3://data/output/x/")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    assert load_config(path).input.image_prefix == "s3://data/images/"
    batch = ["run", "--config", str(path), "--input", "s3://data/batch-api/files/f", "--no-image-prefix"]
    assert load_job_config(parser.parse_args(batch)).input.image_prefix is None
