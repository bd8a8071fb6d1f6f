"""How every tier starts the job: one command and one run spec, shared by the image, the tiers and the tests.

The workload image's ENTRYPOINT is `ENTRYPOINT` and its CMD is `run_args(CONFIG_PATH)`; the small tier's node
runs the image as is, the RayJob on EKS runs the same argv on the Ray head, and the end-to-end tests run
`python -m MODULE *run_args(file)` locally. Tests hold the Dockerfile to these constants, so the command
production runs is the command the tests ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MODULE = "workload"
ENTRYPOINT: tuple[str, ...] = ("python", "-m", MODULE)

# Inside the container: the job config is mounted read-only here (the small node's user data writes it, a
# ConfigMap holds it on EKS); the node's disk is mounted at MODELS_DIR so downloaded weights survive restarts.
CONFIG_PATH = "/etc/llm-batch/job.yaml"
MODELS_DIR = "/models"
MODEL_CACHE_DIR = f"{MODELS_DIR}/llm-batch"  # the value the tiers render into the job config's model.cache_dir
HF_HOME = f"{MODELS_DIR}/huggingface"  # hub downloads land on the same disk


def run_args(config_path: str = CONFIG_PATH) -> list[str]:
    """The arguments after the entrypoint that run one batch job from a config file."""
    if not config_path.strip():
        raise ValueError("config_path is empty: the job needs a config file to run")
    return ["run", "--config", config_path]


def command(config_path: str = CONFIG_PATH) -> list[str]:
    """The full argv a container or a RayJob runs."""
    return [*ENTRYPOINT, *run_args(config_path)]


# Ray starts its workers at nice 15 so that a node's raylet and GCS stay responsive under user work. Here the
# engine is the node's work: its actor, vLLM's engine core and model runner (which inherit the nice value) lost
# the CPU to the driver's scheduling loop and Ray's own processes, and the job kept 0.78-0.80 of a bare engine's
# steady-state throughput on the bimodal benchmark against 0.92 at nice 0 (2 cores, docs/benchmark.md). A GPU
# node's engine core schedules every step on the CPU, so the same preemption idles the GPU. Read by the raylet at
# its start: the container's `ray start` on Kubernetes, the job's own private Ray elsewhere (workload/runtime.py).
WORKER_NICENESS: dict[str, str] = {"RAY_worker_niceness": "0"}
# Ray's usage statistics off: a batch node has no business reporting to Ray's collector (and the private subnets of
# the EKS tiers have no route to it). With it off, the job also skips Ray Data LLM's telemetry actor
# (workload/engine/pipeline.py, usage_telemetry_off_when_disabled).
NO_USAGE_STATS: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0"}
RAY_NODE_SETTINGS: dict[str, str] = {**WORKER_NICENESS, **NO_USAGE_STATS}


# --- The run spec: how every tier starts the container, defined once ----------------------------------------------
# The small node's `docker run` (infra/components/user_data.py), the RayJob's pods (infra/k8s/rayjob.py) and the
# container tests (tests/workload/test_container.py) all render from here. What only a GPU host has (`--gpus all`,
# the awslogs log driver, the shared-memory size of a big node) stays with the tier that has it.

# The image's user (workload/Dockerfile: `useradd --uid 1000 --user-group`), numeric so runAsNonRoot can check it.
JOB_UID = 1000
JOB_GID = 1000
# The root filesystem is read-only. Scratch (Ray's session folder under /tmp/ray, compile caches, temp files) goes
# to a tmpfs here, and HOME points into it so libraries that cache under ~ (vLLM, Triton, matplotlib) write there.
SCRATCH_DIR = "/tmp"
SCRATCH_SIZE_GIB = 4  # a tmpfs: memory
# On Kubernetes the scratch is an emptyDir on the node's disk, with room for objects Ray spills out of /dev/shm.
SCRATCH_DISK_GIB = 20
# The hub token, a file the job reads through HF_TOKEN_PATH: never an environment value or an argument. Its
# folder is mounted read-only (a folder, so a tier without a token mounts it empty and public models still load).
HUB_TOKEN_DIR = "/var/run/llm-batch/secrets"
HUB_TOKEN_PATH = f"{HUB_TOKEN_DIR}/hub_token"
# Seconds between SIGTERM and SIGKILL beyond the job's own grace period (resume.grace_period_s): time for Ray
# and vLLM to exit once the finished shards are committed and `_interrupted.json` is written.
STOP_MARGIN_S = 20
# What every tier sets; the token's path only where a token file is mounted.
ENV: dict[str, str] = {"HOME": SCRATCH_DIR, "HF_HUB_DISABLE_TELEMETRY": "1", **RAY_NODE_SETTINGS}
TOKEN_ENV: dict[str, str] = {"HF_TOKEN_PATH": HUB_TOKEN_PATH}


@dataclass(frozen=True)
class HostPaths:
    """Where a host keeps what the container mounts: the model cache (writable by JOB_UID), the job config
    (read-only at CONFIG_PATH) and the folder holding the hub token file, if any (read-only at HUB_TOKEN_DIR)."""

    models: str
    config: str
    secrets: str

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value.strip() or any(char in value for char in ":,\n"):
                raise ValueError(f"host path for {name} {value!r} is empty or holds ':', ',' or a newline")


def stop_timeout_s(grace_period_s: float) -> int:
    """The wait between SIGTERM and SIGKILL: the job's grace period and the margin for Ray and vLLM to exit."""
    if grace_period_s < 0:
        raise ValueError(f"grace_period_s {grace_period_s} is negative")
    return math.ceil(grace_period_s) + STOP_MARGIN_S


def docker_run_flags(host: HostPaths, stop_timeout: int) -> list[str]:
    """The `docker run` / `podman run` options of the spec, placed before the image (the same argv both take)."""
    flags = [
        # An init as PID 1 reaps what Ray and vLLM leave behind and passes SIGTERM on to the job.
        "--init",
        "--user",
        f"{JOB_UID}:{JOB_GID}",
        "--read-only",
        "--tmpfs",
        f"{SCRATCH_DIR}:rw,nosuid,nodev,size={SCRATCH_SIZE_GIB}g,mode=1777",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--stop-timeout",
        str(stop_timeout),
        "-v",
        f"{host.models}:{MODELS_DIR}",
        "-v",
        f"{host.config}:{CONFIG_PATH}:ro",
        "-v",
        f"{host.secrets}:{HUB_TOKEN_DIR}:ro",
    ]
    for key, value in {**ENV, **TOKEN_ENV}.items():
        flags += ["-e", f"{key}={value}"]
    return flags


def container_security_context() -> dict[str, Any]:
    """Kubernetes' securityContext of a container running the image: no privileges, read-only root."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def pod_security_context() -> dict[str, Any]:
    # fsGroup makes the pod's volumes (the /models cache among them) writable to the job's user.
    return {
        "runAsNonRoot": True,
        "runAsUser": JOB_UID,
        "runAsGroup": JOB_GID,
        "fsGroup": JOB_GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def k8s_env() -> list[dict[str, str]]:
    """ENV as a container's `env` (the token's path is added with the token's volume, where there is one)."""
    return [{"name": key, "value": value} for key, value in ENV.items()]


def k8s_scratch_volume(name: str) -> dict[str, Any]:
    # On the node's disk: Ray's session logs and spilled objects would otherwise count against the pod's memory.
    return {"name": name, "emptyDir": {"sizeLimit": f"{SCRATCH_DISK_GIB}Gi"}}
