"""Build the Batch API function's code: the front's workload packages plus requirements/lambda.lock's wheels for
the function's runtime and architecture (infra/components/batch_api.py: python3.12 on arm64).

`python tools/lambda_bundle.py` downloads the locked wheels (`pip download --no-deps --require-hashes --only-binary
:all: --platform ... --python-version 3.12`, a --platform for each manylinux tag the runtime takes: binary wheels
of exactly the locked files, whatever machine builds) and unpacks them beside `workload/` into
build/batch-api-lambda/, which `pulumi up` zips. It needs the package index; the plan's tests check the command and
the lock without it (tests/infra/test_batch_api_component.py).

The lock itself has one writer, tools/locks.py (`python tools/locks.py lambda --upgrade`: the set's whole tree,
under dev.lock's pins, with a date cut); this tool only reads it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.components.batch_api import BUNDLE_DIR, FRONT_PACKAGES, PIP_PLATFORMS, PYTHON_VERSION, bundle_stamp

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lambda.lock"


def download_command(requirements: Path, dest: Path) -> list[str]:
    """pip's argv for the function's wheels: binary only, for its platform and Python, not this machine's."""
    platforms = [arg for platform in PIP_PLATFORMS for arg in ("--platform", platform)]
    target = ["--only-binary", ":all:", *platforms, "--python-version", PYTHON_VERSION]
    pinned = ["--no-deps", "--require-hashes"]
    return [sys.executable, "-m", "pip", "download", "-q", *target, "--implementation", "cp", *pinned,
            "-r", str(requirements), "-d", str(dest)]  # fmt: skip


def build() -> Path:
    shutil.rmtree(BUNDLE_DIR, ignore_errors=True)
    BUNDLE_DIR.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(download_command(LOCK, Path(folder)), check=True)
        for wheel in sorted(Path(folder).glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(BUNDLE_DIR)
    for package in FRONT_PACKAGES:
        source = ROOT / package
        if source.is_dir():
            shutil.copytree(source, BUNDLE_DIR / package, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, BUNDLE_DIR / package)
    (BUNDLE_DIR / ".lock-sha256").write_text(bundle_stamp())
    return BUNDLE_DIR


def main(argv: list[str]) -> int:
    if argv:
        # The old `--lock` wrote a second, flat lock beside tools/locks.py's: refused by name, not run.
        print(f"lambda_bundle.py takes no arguments, got {argv}; the lock: tools/locks.py lambda", file=sys.stderr)
        return 2
    print(f"built {build().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
