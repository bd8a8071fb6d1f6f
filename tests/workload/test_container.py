"""The workload image, built and run here: the product's deliverable, not a parsed Dockerfile.

One CPU build of workload/Dockerfile (tools/image.py: podman with runc, a debootstrap base, both cached), then the
container runs the job exactly as the tiers start it, from the run spec (workload/contract/entrypoint.py): non-root,
read-only
root with a scratch tmpfs, the node's model cache at /models, the config file at /etc/llm-batch/job.yaml and the hub
token as a file. Input and output live on the moto server on the host (--network=host), the S3 the job speaks.

Two runs of the job share the work: the first is stopped with the spec's stop timeout while it works (the
Spot notice / `docker stop` path: `_interrupted.json` within the grace period); the second is its rerun, which must
finish the rest with every input id exactly once, write results, errors and summary, and reuse the first run's
model cache rather than make a second copy. Missing tools are installed (tools/image.ensure_tools), never skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.workload.jobrun import write_config
from tests.workload.test_resume import ROWS, _assert_complete, _input_rows, _s3_output
from tools import image as image_tool
from workload.contract import entrypoint
from workload.engine.tiny_model import TINY_MODEL_VERSION

pytestmark = pytest.mark.slow

GRACE_S = 20
TOKEN = f"hf_container_test_{uuid.uuid4().hex}"
# What never belongs in the image: weights, credentials and the project's tests or build leftovers.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".onnx")
SECRET_NAMES = {"credentials", ".netrc", ".git-credentials", "hub_token", "id_rsa", "id_ed25519", ".env", "token"}
MAX_LIBRARY_DATA = 5 * 2**20
# vLLM loads its CPU kernels as the platform does at engine start; the worker's first call needs this op.
KERNELS_LOAD = (
    "import torch; from vllm.platforms import current_platform; current_platform.import_kernels(); "
    "print('loaded' if hasattr(torch.ops._C, 'init_cpu_memory_env') else 'missing')"
)
# The job's progress line (workload/telemetry/progress.py): rows are flowing through the engine.
PROGRESS = "[llm-batch] attempt 1: "
LEFTOVERS = ("src", "root/.cache", "opt/wheels", "opt/pypi", "opt/pypi-more", "etc/pip.conf", "tmp/pip")


def _podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=image_tool.podman_env(), capture_output=True, text=True, check=check, timeout=timeout
    )


@pytest.fixture(scope="module")
def image() -> str:
    started = time.monotonic()
    reference = image_tool.build_image()
    size = image_tool.image_size_bytes(reference)
    print(f"\n[container] image {reference}: {size / 1e9:.2f} GB, ready in {time.monotonic() - started:.0f} s")
    return reference


@pytest.fixture(scope="module")
def host_paths(tmp_path_factory: pytest.TempPathFactory) -> entrypoint.HostPaths:
    """The node's side of the mounts: a model cache and a token folder owned by the job's user, as the small
    tier's boot script makes them."""
    root = tmp_path_factory.mktemp("node")
    models, secrets = root / "models", root / "secrets"
    models.mkdir()
    secrets.mkdir(mode=0o700)
    token = secrets / "hub_token"
    token.write_text(TOKEN)
    token.chmod(0o400)
    for path in (models, secrets, token):
        os.chown(path, entrypoint.JOB_UID, entrypoint.JOB_GID)
    return entrypoint.HostPaths(models=str(models), config=str(root / "job.yaml"), secrets=str(secrets))


def test_the_image_holds_only_the_job_and_runs_as_non_root(image: str) -> None:
    assert _podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == "1000:1000"
    user = _podman("run", "--rm", "--read-only", "--entrypoint", "id", image, "-u").stdout.strip()
    assert user == str(entrypoint.JOB_UID)
    # vLLM's CPU kernels are native libraries with their own system dependencies (libnuma): when one is missing,
    # `vllm._C` fails to load with only a warning and the engine's worker dies at start, far from the cause.
    kernels = _podman("run", "--rm", "--read-only", "--entrypoint", "python", image, "-c", KERNELS_LOAD, timeout=180)
    assert kernels.stdout.strip() == "loaded", kernels.stdout + kernels.stderr

    mount = Path(_podman("image", "mount", image).stdout.strip())
    try:
        sizes = {
            path.relative_to(mount).as_posix(): path.stat().st_size
            for path in mount.rglob("*")
            if not path.is_symlink() and path.is_file()
        }
        folders = {path.relative_to(mount).as_posix() for path in mount.rglob("*") if path.is_dir()}
    finally:
        _podman("image", "unmount", image, check=False)
    names = set(sizes)
    # A library's own small data files (sentencepiece's normalisation tables, ...) are not a model's weights.
    weights = [
        name
        for name in names
        if name.endswith(WEIGHT_SUFFIXES) and ("/site-packages/" not in name or sizes[name] > MAX_LIBRARY_DATA)
    ]
    assert not weights, f"model weights or a stray binary cache in the image: {weights}"
    # Files only: a library's module folder may be called `credentials` (anthropic/lib/credentials/).
    secrets = [name for name in names if Path(name).name in SECRET_NAMES or "/.aws/" in f"/{name}"]
    assert not secrets, f"credentials in the image: {secrets}"
    leftovers = [
        name for name in names | folders if any(name == left or name.startswith(left + "/") for left in LEFTOVERS)
    ]
    assert not leftovers, f"build leftovers in the image: {leftovers[:20]}"
    assert not [name for name in names if name.startswith("var/cache/apt/archives/") and name.endswith(".deb")]
    assert not [name for name in names if name.startswith("var/lib/apt/lists/") and "lock" not in name]
    # The job's own package lives in /opt/job (on PYTHONPATH), apart from the locked venv (workload/Dockerfile).
    site = "opt/venv/lib/python3.11/site-packages"
    installed = {name.split("/")[5] for name in folders if name.startswith(site + "/") and name.count("/") >= 5}
    assert not {"workload", "tests", "infra", "monitoring", "tools"} & installed, "the venv holds the lock only"
    project = {name.split("/")[2] for name in folders if name.startswith("opt/job/") and name.count("/") >= 2}
    assert "workload" in project
    assert not {"tests", "infra", "monitoring", "tools"} & project, "only the job's package is installed"
    assert not [name for name in names if name.startswith("opt/job/workload/") and "/tests/" in name]
    # The embedded model is built at run time into /models, never shipped.
    assert not [name for name in names if TINY_MODEL_VERSION in name]
    assert not [name for name in names if name.startswith(("tmp/", "models/"))], "scratch and cache start empty"


@contextlib.contextmanager
def _container(image: str, host: entrypoint.HostPaths, name: str, endpoint: str) -> Iterator[str]:
    """The job's container started from the run spec, plus what only this test host adds: the network (to reach
    moto on 127.0.0.1), moto's fake credentials and endpoint, and a shared-memory size for Ray."""
    aws = {key: os.environ[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    aws.update(AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    command = ["run", "-d", "--name", name, "--network", "host", "--shm-size", "2g"]
    command += entrypoint.docker_run_flags(host, entrypoint.stop_timeout_s(GRACE_S))
    for key, value in aws.items():
        command += ["-e", f"{key}={value}"]
    _podman("rm", "-f", name, check=False)
    _podman(*command, image, *entrypoint.run_args())
    try:
        yield name
    finally:
        _podman("rm", "-f", "-t", "0", name, check=False)


def _wait(name: str, timeout: float) -> int:
    return int(_podman("wait", name, timeout=timeout).stdout.strip())


def _logs(name: str) -> str:
    result = _podman("logs", name, check=False)
    return result.stdout + result.stderr


def _model_copies(models: Path) -> dict[str, int]:
    """Every copy of the tiny model under the cache (its config.json), with the inode of that file."""
    return {str(path.relative_to(models)): path.stat().st_ino for path in models.rglob("config.json")}


def test_the_job_runs_in_its_container_stops_in_grace_and_resumes_once(
    image: str, host_paths: entrypoint.HostPaths, moto_endpoint: str
) -> None:
    bucket = f"container-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    body = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in _input_rows())
    s3.put_object(Bucket=bucket, Key="in/rows.jsonl", Body=body)
    config = write_config(
        Path(host_paths.config),
        f"s3://{bucket}/in/",
        f"s3://{bucket}/out",
        Path(entrypoint.MODEL_CACHE_DIR),
        resume={"grace_period_s": GRACE_S},
        # One batch in flight and long answers (every row decodes all its tokens): shards commit seconds apart, so the
        # stop lands mid-run. With 32 tokens that may stop, the rows after the first progress line took under a
        # second, the poll below missed them and the stop found a finished job (exit 0), as test_resume found.
        max_concurrent_batches=1,
        sampling={"max_tokens": 96, "temperature": 0.0, "ignore_eos": True},
    )
    config.chmod(0o644)
    output = _s3_output(bucket, "out")
    models = Path(host_paths.models)
    stop_timeout = entrypoint.stop_timeout_s(GRACE_S)

    # The first run: stopped mid-run as `docker stop` (and the small node's Spot watcher) stops it.
    started = time.monotonic()
    with _container(image, host_paths, f"llm-batch-test-{uuid.uuid4().hex[:8]}", moto_endpoint) as name:
        inspect = _podman("inspect", name).stdout
        assert TOKEN not in inspect, "the hub token must reach the job as a file, never in its env or argv"
        # Stopped once the job is in its work loop (its first progress line) and a stage actor has fetched the model
        # into the mounted cache (the nodes fetch it, not the driver), not after a commit: Ray Data can hand the
        # driver every row of a block at once, and a stop after that finds no work left.
        deadline = time.monotonic() + 600
        while (
            not (PROGRESS in _logs(name) and _model_copies(models)) and not output.markers()
        ) and time.monotonic() < deadline:
            assert _podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true", _logs(name)
            time.sleep(0.2)
        log = _logs(name)
        assert PROGRESS in log or output.markers(), f"the job never reached its work loop:\n{log[-4000:]}"
        stopping = time.monotonic()
        _podman("stop", "--time", str(stop_timeout), name, timeout=stop_timeout + 30)
        stopped_in = time.monotonic() - stopping
        code, log = _wait(name, timeout=30), _logs(name)
    first_run_s = time.monotonic() - started
    # 143: the job's own exit on SIGTERM; 137 would be the SIGKILL at the end of the stop timeout.
    assert code == 143, log[-4000:]
    assert stopped_in < GRACE_S + 5, f"the job took {stopped_in:.0f} s to stop; its grace period is {GRACE_S} s"
    note = s3.head_object(Bucket=bucket, Key="out/_interrupted.json")
    assert "SIGTERM" in note["Metadata"]["reason"] and note["LastModified"] is not None
    assert output.summary() is None
    output.assert_results_only_from_committed_shards()
    copies = _model_copies(models)
    assert list(copies) == [f"llm-batch/{TINY_MODEL_VERSION}/config.json"], copies
    assert all(path.stat().st_uid == entrypoint.JOB_UID for path in models.rglob("*")), "the cache is the job's"

    # The rerun: the rest of the input, exactly once, from the same cache.
    started = time.monotonic()
    with _container(image, host_paths, f"llm-batch-test-{uuid.uuid4().hex[:8]}", moto_endpoint) as name:
        code, log = _wait(name, timeout=600), _logs(name)
    rerun_s = time.monotonic() - started
    assert code == 0, log[-4000:]
    _assert_complete(output, attempts=2)
    summary = output.summary()
    assert summary is not None and summary["rows_in"] == ROWS
    assert output.names("results/") and output.names("errors/")
    assert "_interrupted.json" not in output.names("")
    assert _model_copies(models) == copies, "the rerun made a second copy of the model instead of reusing it"
    assert TOKEN not in log
    print(f"\n[container] stopped run {first_run_s:.0f} s (stop took {stopped_in:.1f} s), rerun {rerun_s:.0f} s")
