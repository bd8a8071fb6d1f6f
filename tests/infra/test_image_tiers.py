"""Every tier runs the one image the plan builds, with the command the image and the tests share.

Small: the Spot node's user data pulls and runs the image reference the image component exports. Medium and
large: the RayJob the nightly run renders from the program's `rayjob_args` export runs that reference on the Ray
head and every worker. The plan comes from the Pulumi program under mocks (`plan_for`), since no Pulumi CLI or
AWS account exists here.
"""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from infra import versions
from infra.components import user_data
from infra.components.image import DOCKERFILE, REPO_ROOT
from infra.config import load_stack_config
from infra.eks_job import night_manifests
from infra.k8s import rayjob
from workload.contract import entrypoint

Plan = list[dict[str, Any]]


def _one(plan: Plan, typ: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == typ]
    assert len(found) == 1, f"{typ}: {len(found)} in the plan"
    return found[0]


def _image_ref(plan: Plan) -> str:
    ref = str(_one(plan, "docker-build:index:Image")["outputs"]["ref"])
    assert "@sha256:" in ref and ":ctx-" in ref, ref
    return ref


def _docker_commands(script: str) -> list[list[str]]:
    """The script's `docker ...` commands as argv lists (continuation lines joined)."""
    joined = script.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line.split("||")[0], comments=True) if line.strip() else []
        if words[:1] == ["docker"]:
            commands.append(words)
    return commands


def test_small_node_pulls_and_runs_exactly_the_built_image_with_the_shared_command(plan_for) -> None:
    plan = plan_for("small")
    ref = _image_ref(plan)
    template = _one(plan, "aws:ec2/launchTemplate:LaunchTemplate")
    script = base64.b64decode(template["inputs"]["userData"]).decode()
    commands = _docker_commands(script)
    assert ["docker", "pull", ref] in commands
    (run,) = [command for command in commands if command[1] == "run"]
    # Everything after the image is the image's CMD: the job's own `run --config <file>`, then a Batch API batch's
    # `--input`/`--output` (an empty array on a night: tests/infra/test_user_data.py runs both).
    assert run[run.index(ref) + 1 :] == [*entrypoint.run_args(entrypoint.CONFIG_PATH), "${BATCH_ARGS[@]}"]
    assert "--gpus" in run
    # No other image is ever named in the boot script.
    assert script.count(".dkr.ecr.") == script.count(ref) + 1  # + the registry `docker login` targets


def test_small_node_gives_the_job_files_to_the_image_user() -> None:
    final_user = [
        item["value"] for item in DockerfileParser(str(DOCKERFILE)).structure if item["instruction"] == "USER"
    ]
    assert final_user[-1].split(":")[0] == str(user_data.JOB_UID)
    assert user_data.job_config_path() == entrypoint.CONFIG_PATH


def test_the_job_can_pull_only_its_own_repository(plan_for) -> None:
    plan = plan_for("small")
    repository_arn = _one(plan, "aws:ecr/repository:Repository")["outputs"]["arn"]
    policy = json.loads(_one(plan, "aws:iam/policy:Policy")["inputs"]["policy"])
    pulls = [statement for statement in policy["Statement"] if "ecr:BatchGetImage" in statement["Action"]]
    assert [statement["Resource"] for statement in pulls] == [repository_arn]


def test_every_tier_caches_weights_on_the_node_disk() -> None:
    for tier in ("small", "medium", "large"):
        config = load_stack_config(tier, {"cost_center": "x"})
        job = config.job_config("s3://bucket/input/", "s3://bucket/output/", stack=tier)
        assert job.model.cache_dir == entrypoint.MODEL_CACHE_DIR


def _exports(plan: Plan) -> dict[str, Any]:
    return dict(_one(plan, "pulumi:pulumi:Stack")["outputs"])


def test_every_stack_exports_the_image_it_built(plan_for) -> None:
    for stack in ("small", "medium", "large"):
        plan = plan_for(stack)
        assert _exports(plan)["image_ref"] == _image_ref(plan)


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_eks_ray_pods_run_exactly_the_built_image_with_the_shared_command(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    ref = _image_ref(plan)
    args = rayjob.RayJobArgs.model_validate_json(_exports(plan)["rayjob_args"])
    assert args.image == ref
    manifests = night_manifests(
        args, run_id="20261129t0100", input_uri="s3://bucket/input/2026-11-29/", output_uri="s3://bucket/out/"
    )
    (job,) = [manifest for manifest in manifests if manifest["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]] + [group["template"] for group in cluster["workerGroupSpecs"]]
    images = {container["image"] for template in templates for container in template["spec"]["containers"]}
    assert images == {ref}
    # The RayJob runs, on the head, the very argv the image's ENTRYPOINT + CMD run on the small node.
    assert shlex.split(job["spec"]["entrypoint"]) == entrypoint.command(entrypoint.CONFIG_PATH)
    (config_map,) = [manifest for manifest in manifests if manifest["kind"] == "ConfigMap"]
    job_config = yaml.safe_load(config_map["data"][rayjob.CONFIG_FILE])
    assert job_config["model"]["cache_dir"] == entrypoint.MODEL_CACHE_DIR
    assert f"{rayjob.CONFIG_DIR}/{rayjob.CONFIG_FILE}" == entrypoint.CONFIG_PATH


def test_kuberay_is_told_the_ray_version_the_image_installs() -> None:
    pinned = dict(
        line.split("==", 1)
        for line in (REPO_ROOT / "requirements" / "gpu.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pinned["ray[data,serve]"] == versions.RAY_VERSION
