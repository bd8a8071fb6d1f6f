"""The workload image: an ECR repository and the image Pulumi builds from this repo and pushes to it.

Every tier runs `WorkloadImage.image_ref`, one exact reference: the repository URL, a tag that is the content
hash of the build context (immutable in ECR) and the digest of what was pushed. The small node's user data and
the EKS tiers' Ray pods take this reference, so production runs the image the tests describe and nothing else.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from infra import naming, versions
from infra.build_context import content_tag
from infra.config import StackConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "workload" / "Dockerfile"
_PLATFORMS = {
    "linux/amd64": docker_build.Platform.LINUX_AMD64,
    "linux/arm64": docker_build.Platform.LINUX_ARM64,
}
# Untagged images are only ever left by an interrupted push; a day is enough to inspect one.
UNTAGGED_EXPIRE_DAYS = 1


@dataclass(frozen=True)
class WorkloadImageArgs:
    stack: str
    key_arn: pulumi.Input[str]
    keep_last_images: int
    repository_name: str | None = None
    # `pulumi destroy` deletes the repository with its images (they are rebuilt from source on a new deploy).
    force_delete: bool = True
    base_image: str = versions.WORKLOAD_BASE_IMAGE
    platform: str = versions.WORKLOAD_IMAGE_PLATFORM
    context_dir: Path = REPO_ROOT
    dockerfile: Path = DOCKERFILE

    @classmethod
    def from_config(cls, stack: str, config: StackConfig, key_arn: pulumi.Input[str]) -> WorkloadImageArgs:
        return cls(
            stack=stack,
            key_arn=key_arn,
            keep_last_images=config.image.keep_last_images,
            repository_name=config.image.repository_name,
            force_delete=config.image.force_delete,
        )

    def __post_init__(self) -> None:
        if self.keep_last_images < 1:
            raise ValueError(f"keep_last_images must be at least 1, not {self.keep_last_images}")
        if self.platform not in _PLATFORMS:
            raise ValueError(f"platform {self.platform!r} is not one of {sorted(_PLATFORMS)}")
        if not self.dockerfile.is_file():
            raise ValueError(f"no Dockerfile at {self.dockerfile}")

    @property
    def build_args(self) -> dict[str, str]:
        return {"BASE_IMAGE": self.base_image}

    @property
    def repository(self) -> str:
        return self.repository_name or f"{naming.prefix(self.stack)}/workload"

    @property
    def tag(self) -> str:
        return content_tag(self.context_dir, self.dockerfile, self.build_args, self.platform)


def lifecycle_policy(keep_last_images: int) -> dict[str, Any]:
    """Expire untagged images after a day, and every image beyond the newest `keep_last_images`."""
    return {
        "rules": [
            {
                "rulePriority": 1,
                "description": f"untagged images after {UNTAGGED_EXPIRE_DAYS} day",
                "selection": {
                    "tagStatus": "untagged",
                    "countType": "sinceImagePushed",
                    "countUnit": "days",
                    "countNumber": UNTAGGED_EXPIRE_DAYS,
                },
                "action": {"type": "expire"},
            },
            {
                # ECR requires the `any` rule to have the lowest priority (the highest number).
                "rulePriority": 2,
                "description": f"keep the last {keep_last_images} images",
                "selection": {
                    "tagStatus": "any",
                    "countType": "imageCountMoreThan",
                    "countNumber": keep_last_images,
                },
                "action": {"type": "expire"},
            },
        ]
    }


def _relative(path: Path) -> str:
    # Pulumi runs the program from infra/; a relative path keeps the recorded inputs equal on every machine,
    # so a checkout elsewhere does not look like a change to the image.
    return os.path.relpath(path, Path.cwd())


class WorkloadImage(pulumi.ComponentResource):
    """`repository_url`, `repository_arn` (for the nodes' pull permission) and `image_ref`, the exact
    `<repository_url>:<content tag>@sha256:<digest>` every tier runs."""

    repository_url: pulumi.Output[str]
    repository_arn: pulumi.Output[str]
    image_ref: pulumi.Output[str]
    tag: str

    def __init__(self, name: str, args: WorkloadImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:image:WorkloadImage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        repository = aws.ecr.Repository(
            f"{name}-repository",
            name=args.repository,
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[
                aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS", kms_key=args.key_arn)
            ],
            force_delete=args.force_delete,
            opts=child,
        )
        aws.ecr.LifecyclePolicy(
            f"{name}-lifecycle",
            repository=repository.name,
            policy=json.dumps(lifecycle_policy(args.keep_last_images)),
            opts=child,
        )
        # A short-lived token (12 h) read at deploy time; the provider keeps it as a secret.
        token = aws.ecr.get_authorization_token_output(
            registry_id=repository.registry_id, opts=pulumi.InvokeOptions(parent=self)
        )
        tag = self.tag = args.tag
        image = docker_build.Image(
            f"{name}-image",
            context=docker_build.BuildContextArgs(location=_relative(args.context_dir)),
            dockerfile=docker_build.DockerfileArgs(location=_relative(args.dockerfile)),
            build_args=args.build_args,
            platforms=[_PLATFORMS[args.platform]],
            tags=[repository.repository_url.apply(lambda url: f"{url}:{tag}")],
            push=True,
            # Preview needs no Docker engine; `up` builds, and only when the content tag is new.
            build_on_preview=False,
            registries=[
                docker_build.RegistryArgs(
                    address=repository.repository_url.apply(lambda url: url.split("/", 1)[0]),
                    username=token.user_name,
                    password=pulumi.Output.secret(token.password),
                )
            ],
            labels={
                "org.opencontainers.image.title": naming.PROJECT,
                "org.opencontainers.image.version": tag,
            },
            opts=child,
        )
        self.repository_url = repository.repository_url
        self.repository_arn = repository.arn
        self.image_ref = image.ref
        self.register_outputs(
            {
                "repository_url": self.repository_url,
                "repository_arn": self.repository_arn,
                "image_ref": self.image_ref,
            }
        )
