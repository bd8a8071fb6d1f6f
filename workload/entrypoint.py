"""How every tier starts the job: one command, shared by the image, the tiers and the end-to-end tests.

The workload image's ENTRYPOINT is `ENTRYPOINT` and its CMD is `run_args(CONFIG_PATH)`; the small tier's node
runs the image as is, the RayJob on EKS runs the same argv on the Ray head, and the end-to-end tests run
`python -m MODULE *run_args(file)` locally. Tests hold the Dockerfile to these constants, so the command
production runs is the command the tests ran.
"""

from __future__ import annotations

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
