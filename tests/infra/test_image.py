"""The workload image in every tier's plan: an ECR repository with the house settings, and one image built
from this repo, tagged by its content, that every stack refers to by the same tag.

The plan comes from the Pulumi program run under mocks (`plan_for`): no Pulumi CLI, Docker engine or AWS
account exists here, so the mocks answer as ECR and docker-build would (repository URL, pushed digest).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from infra import versions
from infra.build_context import content_tag
from infra.components.image import DOCKERFILE, REPO_ROOT, WorkloadImageArgs, lifecycle_policy
from infra.config import StackConfig, StackConfigError, decode_pulumi_values, load_stack_config
from infra.ops.stacks import PROGRAM_DIR, read_stack_config
from infra.rules import registry
from tests.infra.conftest import STACKS
from tests.infra.plan_select import stack_key

Plan = list[dict[str, Any]]


def _one(plan: Plan, typ: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == typ]
    assert len(found) == 1, f"{typ}: {len(found)} in the plan"
    return found[0]


def _stack_config(stack: str) -> StackConfig:
    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def _expected_tag() -> str:
    return content_tag(
        REPO_ROOT, DOCKERFILE, {"BASE_IMAGE": versions.WORKLOAD_BASE_IMAGE}, versions.WORKLOAD_IMAGE_PLATFORM
    )


@pytest.mark.parametrize("stack", STACKS)
def test_repository_scans_on_push_keeps_tags_immutable_and_encrypts_with_the_stack_key(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    repository = _one(plan, "aws:ecr/repository:Repository")
    # The stack's own key, not the large tier's us-east-1 key for its billing-alarm topic.
    key = stack_key(plan)
    inputs = repository["inputs"]
    assert inputs["imageTagMutability"] == "IMMUTABLE"
    assert inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert inputs["encryptionConfigurations"] == [{"encryptionType": "KMS", "kmsKey": key["outputs"]["arn"]}]
    assert inputs["name"] == (_stack_config(stack).image.repository_name or f"llm-batch-{stack}/workload")
    assert repository["parent"] == _one(plan, "llmbatch:image:WorkloadImage")["urn"]
    # `pulumi destroy` is not blocked by the images in it (they are rebuilt from source): docs/destroy.md.
    assert inputs["forceDelete"] is _stack_config(stack).image.force_delete is True


@pytest.mark.parametrize("stack", STACKS)
def test_lifecycle_keeps_the_last_n_images_of_that_repository(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    policy = _one(plan, "aws:ecr/lifecyclePolicy:LifecyclePolicy")["inputs"]
    assert policy["repository"] == _one(plan, "aws:ecr/repository:Repository")["outputs"]["name"]
    rules = json.loads(policy["policy"])["rules"]
    keep = [rule for rule in rules if rule["selection"]["tagStatus"] == "any"]
    assert len(keep) == 1
    assert keep[0]["selection"]["countType"] == "imageCountMoreThan"
    assert keep[0]["selection"]["countNumber"] == _stack_config(stack).image.keep_last_images
    assert keep[0]["action"] == {"type": "expire"}


@pytest.mark.parametrize("stack", STACKS)
def test_image_is_built_from_this_repo_and_pushed_under_its_content_tag(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    image = _one(plan, "docker-build:index:Image")
    repository = _one(plan, "aws:ecr/repository:Repository")["outputs"]
    inputs = image["inputs"]
    # Locations are relative to infra/, where Pulumi runs the program.
    assert (PROGRAM_DIR / inputs["context"]["location"]).resolve() == REPO_ROOT
    assert (PROGRAM_DIR / inputs["dockerfile"]["location"]).resolve() == DOCKERFILE
    assert inputs["buildArgs"] == {"BASE_IMAGE": versions.WORKLOAD_BASE_IMAGE}
    assert inputs["platforms"] == [versions.WORKLOAD_IMAGE_PLATFORM]
    assert inputs["push"] is True and inputs["buildOnPreview"] is False
    assert inputs["tags"] == [f"{repository['repositoryUrl']}:{_expected_tag()}"]
    # The registry credentials are a secret in the plan and the state, never printed.
    assert inputs["registries"] == "[secret]"
    assert image["outputs"]["ref"] == f"{inputs['tags'][0]}@{image['outputs']['digest']}"


def test_every_stack_builds_the_same_image_content(plan_for) -> None:
    tags = {stack: _one(plan_for(stack), "docker-build:index:Image")["inputs"]["tags"][0] for stack in STACKS}
    assert {tag.rsplit(":", 1)[1] for tag in tags.values()} == {_expected_tag()}


def test_dockerfile_base_default_is_the_pinned_version() -> None:
    lines = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ARG BASE_IMAGE=")]
    assert lines == [f"ARG BASE_IMAGE={versions.WORKLOAD_BASE_IMAGE}"]


def test_lifecycle_rules_satisfy_ecr_ordering() -> None:
    rules = lifecycle_policy(3)["rules"]
    priorities = [rule["rulePriority"] for rule in rules]
    assert len(set(priorities)) == len(priorities)
    # ECR rejects a policy whose `any` rule is not the last to be evaluated.
    last = max(rules, key=lambda rule: rule["rulePriority"])
    assert last["selection"]["tagStatus"] == "any" and last["selection"]["countNumber"] == 3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"keep_last_images": 0}, "keep_last_images must be at least 1"),
        ({"platform": "linux/s390x"}, "platform 'linux/s390x' is not one of"),
        ({"dockerfile": Path("/nonexistent/Dockerfile")}, "no Dockerfile at /nonexistent/Dockerfile"),
    ],
)
def test_bad_image_args_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadImageArgs(**{"stack": "small", "key_arn": "arn", "keep_last_images": 5, **changes})


def test_bad_repository_name_names_the_key() -> None:
    with pytest.raises(StackConfigError, match=r"llm-batch:image\.repository_name: .*not an ECR repository name"):
        load_stack_config("small", {"cost_center": "x", "image": {"repository_name": "Team//Image"}})


def _break(plan: Plan, typ: str, change: Any) -> Plan:
    broken = copy.deepcopy(plan)
    for item in broken:
        if item["type"] == typ:
            change(item)
    return broken


@pytest.mark.parametrize(
    ("typ", "change", "problem"),
    [
        (
            "aws:ecr/repository:Repository",
            lambda item: item["inputs"].update(imageTagMutability="MUTABLE"),
            "tags are mutable",
        ),
        (
            "aws:ecr/repository:Repository",
            lambda item: item["inputs"].update(imageScanningConfiguration={"scanOnPush": False}),
            "not scanned on push",
        ),
        (
            "aws:ecr/repository:Repository",
            lambda item: item["inputs"].update(encryptionConfigurations=[{"encryptionType": "AES256"}]),
            "not encrypted with the stack's KMS key",
        ),
        (
            "aws:ecr/lifecyclePolicy:LifecyclePolicy",
            lambda item: item["inputs"].update(repository="someone-else/repo"),
            "no lifecycle policy",
        ),
        (
            "docker-build:index:Image",
            lambda item: item["inputs"].update(tags=[item["inputs"]["tags"][0].rsplit(":", 1)[0] + ":latest"]),
            "is not a pinned tag",
        ),
        (
            "docker-build:index:Image",
            lambda item: item["inputs"].update(tags=["docker.io/library/python:3.11"]),
            "is not in a repository of this stack",
        ),
    ],
)
def test_image_policy_catches_each_mistake(plan_for, typ: str, change: Any, problem: str) -> None:
    assert registry.check_images(plan_for("small")) == []
    violations = registry.check_images(_break(plan_for("small"), typ, change))
    assert [v for v in violations if problem in v.problem], violations


def test_image_policy_fails_when_the_plan_has_no_repository(plan_for) -> None:
    plan = [item for item in plan_for("small") if item["type"] != "aws:ecr/repository:Repository"]
    with pytest.raises(registry.NothingMatched, match="no ECR repository"):
        registry.check_images(plan)
