"""Inspect the GPU lock's vLLM and torch wheels once: the CUDA architectures their kernels are built for and the
CUDA libraries they link, recorded in requirements/gpu-wheels.json against the lock's hashes.

Why: the image installs requirements/gpu.lock; a wheel without sm_86 (A10G) or sm_80 (A100) kernels, or one
linked against a CUDA newer than the tiers' AMIs' driver supports, fails only on the GPU node, at the first
kernel launch. The test (tests/test_gpu_wheels.py) fails when the lock's hashes for these packages change and
the record was not redone, so a lock bump cannot skip this; CI never downloads the wheels (about 850 MB).

    python tools/gpu_wheels.py WHEEL...     # wheels from `pip download --no-deps --platform manylinux_2_28_x86_64
                                            #   --python-version 3.11 --only-binary=:all: vllm==X torch==Y`

For each shared library in a wheel: ELF `NEEDED` (readelf -d) and, from its `.nv_fatbin` section, the SASS
architectures (sm_XX) and PTX targets. The fatbin layout (a container header 0xBA55ED50, then entries of kind 1 PTX
/ 2 ELF with the target architecture at byte 28 of each entry's header) is what NVIDIA's cuobjdump lists.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "requirements" / "gpu-wheels.json"
LOCK = ROOT / "requirements" / "gpu.lock"
PACKAGES = ("vllm", "torch")
FATBIN_MAGIC = 0xBA55ED50
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_]+)-(?P<version>[^-]+)-")


def lock_hashes(lock_text: str, package: str) -> tuple[str, list[str]]:
    """The version and sha256 hashes the lock pins for `package`."""
    found = re.search(rf"^{package}==(\S+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]+)+)", lock_text, re.MULTILINE)
    if found is None:
        raise ValueError(f"requirements/gpu.lock pins no {package}")
    return found.group(1), re.findall(r"sha256:([0-9a-f]{64})", found.group(2))


def fatbin_architectures(data: bytes) -> tuple[set[int], set[int]]:
    """(SASS sm versions, PTX versions) of every fatbin container in a `.nv_fatbin` section."""
    sass: set[int] = set()
    ptx: set[int] = set()
    offset = 0
    while offset + 16 <= len(data):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, offset)
        if magic != FATBIN_MAGIC:
            offset += 8  # containers are 8-byte aligned; padding between them
            continue
        entry, end = offset + header_size, offset + header_size + fat_size
        while entry + 32 <= end:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            (ptx if kind == 1 else sass).add(arch)
            if entry_header == 0:
                break
            entry += entry_header + payload
        offset = end
    return sass, ptx


def _section(path: Path, name: str) -> bytes:
    out = subprocess.run(["readelf", "-W", "-S", str(path)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 5 and parts[1] == name:
            start, size = int(parts[4], 16), int(parts[5], 16)
            with path.open("rb") as file:
                file.seek(start)
                return file.read(size)
    return b""


def _needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return sorted(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def inspect_wheel(wheel: Path) -> dict[str, object]:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    libraries: dict[str, object] = {}
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        cuda_requires = [
            line.removeprefix("Requires-Dist: ")
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:") and ("cuda" in line or "nvidia" in line) and "extra ==" not in line
        ]
        for member in archive.namelist():
            if not re.search(r"\.so(\.\d+)*$", member):
                continue
            path = Path(archive.extract(member, scratch))
            sass, ptx = fatbin_architectures(_section(path, ".nv_fatbin"))
            libraries[member] = {
                "needed": [n for n in _needed(path) if n.startswith(("libcuda", "libcudart", "libnv", "libcu"))],
                "sass": sorted(f"sm_{a}" for a in sass),
                "ptx": sorted(f"compute_{a}" for a in ptx),
            }
            path.unlink()
    return {"file": wheel.name, "sha256": digest, "cuda_requires": cuda_requires, "libraries": libraries}


def main(argv: list[str]) -> int:
    lock = LOCK.read_text()
    record: dict[str, object] = {"inspected": datetime.now(UTC).strftime("%Y-%m-%d"), "packages": {}}
    packages: dict[str, object] = {}
    for wheel in map(Path, argv):
        match = _WHEEL.match(wheel.name)
        if match is None or match.group("name") not in PACKAGES:
            print(f"{wheel}: not a {'/'.join(PACKAGES)} wheel", file=sys.stderr)
            return 2
        version, hashes = lock_hashes(lock, match.group("name"))
        inspected = inspect_wheel(wheel)
        if inspected["sha256"] not in hashes or match.group("version") != version:
            print(f"{wheel.name} is not a file requirements/gpu.lock pins ({match.group('name')}=={version})")
            return 1
        packages[match.group("name")] = {"version": version, "lock_hashes": sorted(hashes), **inspected}
    record["packages"] = packages
    existing = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    record = {**existing, **record, "packages": {**existing.get("packages", {}), **packages}}
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
