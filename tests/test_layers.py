"""The layers a reader sees in the folder names hold in the imports: no circles, and no import against the grain.

Imports are read from the source (ast), lazy ones inside functions included, since a circle closed by a
function-level import is still a circle; imports under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("infra", "workload", "monitoring")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(inner) for inner in ast.walk(child))
    return skipped


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, resolved to modules (a `from pkg import mod` names the module)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    resolved = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# `python -m infra.<tool>` keeps working through these one-line launchers of the tools in infra/ops.
LAUNCHERS = {"infra.plan", "infra.policy", "infra.preflight", "infra.run", "infra.status", "infra.pricing.refresh"}
# What the deploy-time program and the monitoring may read of the job: its config model, the image's fixed paths
# and the metric names the alarms watch; none of them imports Ray, vLLM or torch (test_plan_imports_no_engine).
# The commands' error boundary (workload.contract.cli_errors) imports only the standard library. The online endpoint's
# config model (workload.contract.serve_config) is the job's config plus a `serve` section, free of Ray like it: the EKS
# tiers' RayService is rendered from it.
WORKLOAD_FOR_INFRA = {
    "workload",
    "workload.contract.config",
    "workload.serve",
    "workload.contract.serve_config",
    "workload.contract.entrypoint",
    "workload.contract.metric_names",
    "workload.contract.cli_errors",
}


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    """The check above is not vacuous: a made-up circle of three modules is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_program_never_imports_the_operator_tools() -> None:
    graph = _graph()
    program = {name for name in graph if name.startswith("infra") and not name.startswith("infra.ops")} - LAUNCHERS
    wrong = {name: sorted(t for t in graph[name] if t.startswith("infra.ops")) for name in program}
    assert {name: targets for name, targets in wrong.items() if targets} == {}


@pytest.mark.parametrize("package", ["infra", "monitoring"])
def test_infra_and_monitoring_read_only_the_jobs_config(package: str) -> None:
    graph = _graph()
    wrong = {
        name: sorted(t for t in targets if t.startswith("workload") and t not in WORKLOAD_FOR_INFRA)
        for name, targets in graph.items()
        if name.split(".")[0] == package
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def test_the_job_never_imports_infra() -> None:
    graph = _graph()
    wrong = {name: sorted(t for t in targets if t.startswith("infra")) for name, targets in graph.items()}
    assert {n: t for n, t in wrong.items() if n.startswith("workload") and t} == {}


ENGINE_PACKAGES = ("ray", "vllm", "torch", "transformers")

_BLOCKER = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ENGINE_PACKAGES!r}:
            raise ImportError("the deploy-time program imported " + name)
sys.meta_path.insert(0, Block())
from infra.ops.plan import main
sys.exit(main(["large", "--json"]))
"""


def test_plan_imports_no_engine() -> None:
    """The plan runs the Pulumi program as `pulumi up` would: with Ray, vLLM and torch unimportable it still works.

    The program ships with the lean deploy requirement set, which has none of them.
    """
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _BLOCKER], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"type": "aws:eks' in result.stdout or "pulumi:pulumi:Stack" in result.stdout
