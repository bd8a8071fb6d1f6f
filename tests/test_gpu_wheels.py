"""The GPU lock's vLLM and torch wheels were inspected (tools/gpu_wheels.py): kernels for every tier GPU and a
CUDA runtime the tiers' AMIs' driver runs. The record stands for the lock's exact files: a lock whose hashes for
either package change without a new inspection fails here. Nothing is downloaded."""

from __future__ import annotations

import json

import pytest

from tools.gpu_wheels import FATBIN_MAGIC, LOCK, PACKAGES, RECORD, fatbin_architectures, lock_hashes

record = json.loads(RECORD.read_text())


@pytest.mark.parametrize("package", PACKAGES)
def test_the_record_stands_for_the_locks_files(package: str) -> None:
    version, hashes = lock_hashes(LOCK.read_text(), package)
    inspected = record["packages"][package]
    assert (inspected["version"], inspected["lock_hashes"]) == (version, sorted(hashes)), (
        f"requirements/gpu.lock's {package} changed since requirements/gpu-wheels.json was written: "
        "download the new wheels and rerun tools/gpu_wheels.py (its docstring says how)"
    )
    assert inspected["sha256"] in hashes  # the file inspected is the lock's Linux x86_64 one


def _architectures(package: str, library: str) -> set[str]:
    return set(record["packages"][package]["libraries"][library]["sass"])


def test_the_kernels_cover_every_tier_gpu() -> None:
    """SASS for sm_80 runs on sm_86/sm_89 too (same major version); each tier's own is there besides."""
    needs = set(record["needs"]["architectures"].values())
    assert needs <= _architectures("torch", "torch/lib/libtorch_cuda.so")
    assert needs <= _architectures("vllm", "vllm/_C_stable_libtorch.abi3.so")
    assert needs <= _architectures("vllm", "vllm/_moe_C_stable_libtorch.abi3.so")
    assert "sm_80" in _architectures("vllm", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")


def test_the_cuda_runtime_is_one_the_amis_driver_runs() -> None:
    runtime = record["needs"]["cuda_runtime"]
    for package in PACKAGES:
        for library in record["packages"][package]["libraries"].values():
            for needed in library["needed"]:
                if needed.startswith("libcudart.so."):
                    assert needed == f"libcudart.so.{runtime}"
    minimum = tuple(int(p) for p in record["needs"]["min_driver"].split("."))
    eks = record["needs"]["ami_drivers"]["eks"]
    assert tuple(int(p) for p in eks["driver"].split(".")) >= minimum
    from infra import versions

    assert eks["ami"] == versions.EKS_AMI_ALIAS, "the pinned EKS AMI moved: record its driver (its CHANGELOG row)"


def test_the_fatbin_reader_reads_a_container() -> None:
    """Not vacuous: a container of one PTX (compute_80) and one SASS (sm_86) entry, laid out as nvcc writes it."""
    import struct

    def entry(kind: int, arch: int, payload: bytes) -> bytes:
        header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)) + b"\0" * 12 + struct.pack("<I", arch)
        return header + b"\0" * (64 - len(header)) + payload

    body = entry(1, 80, b"p" * 16) + entry(2, 86, b"s" * 32)
    container = struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
    assert fatbin_architectures(b"\0" * 8 + container) == ({86}, {80})
