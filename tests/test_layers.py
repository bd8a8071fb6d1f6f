"""The layers a reader sees in the folder names hold in the imports: no circles, and no import against the grain;
and no module of the job reaches into another object's private members.

Imports are read from the source (ast), lazy ones inside functions included, since a circle closed by a
function-level import is still a circle; imports under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("infra", "workload", "monitoring", "tools")


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


@functools.cache  # one read of the sources serves every check here
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
LAUNCHERS = {
    "infra.plan",
    "infra.policy",
    "infra.preflight",
    "infra.run",
    "infra.status",
    "infra.usage",
    "infra.pricing.refresh",
}
# What the deploy-time program and the monitoring may read of the job: the package workload.contract and nothing
# else (its config models, the image's run spec, the metric names the alarms watch, the commands' error boundary,
# the engine sizing the plan and preflight run);
# none of them imports Ray, vLLM or torch (test_plan_imports_no_engine).
WORKLOAD_FOR_INFRA = {
    "workload",
    "workload.contract",
    "workload.contract.config",
    "workload.contract.serve_config",
    "workload.contract.entrypoint",
    "workload.contract.metric_names",
    "workload.contract.cli_errors",
    "workload.contract.engine_sizing",
    "workload.contract.model_shape",
    "workload.contract.jsonl_lines",
    "workload.contract.batch_api_quotas",
    "workload.contract.parser_choice",
    "workload.contract.model_parsers",  # mixed into ModelConfig: the reasoning and tool-call parsers
    "workload.contract.batch_api_priorities",  # mixed into batch_api_quotas: the stack's priorities per key
    "workload.contract.reasoning",
    "workload.contract.tool_calls",
    "workload.contract.images",  # the input's image settings, a mixin of InputConfig (issue 57)
    "workload.contract.image_files",  # a Batch API batch's checked vision files, a mixin of InputConfig
    "workload.contract.vision_shape",  # engine-plan's vision encoder and image tokens, from config.json alone
    "workload.contract.adapter_config",
}


# The job's packages and what each may import of the others (workload/*/__init__.py says why). A package not
# listed may import nothing of the job; the top-level process helpers (runtime, leftovers, failpoints) are layers
# of their own. The direction runs from the commands down to the contract: nothing imports upwards.
PROCESS = {"workload.runtime", "workload.leftovers", "workload.failpoints"}
WORKLOAD_LAYERS: dict[str, set[str]] = {
    "workload.contract": set(),
    "workload.files": {"workload.contract"},
    "workload.telemetry": {"workload.contract"},
    "workload.failpoints": set(),
    "workload.leftovers": set(),
    "workload.auth": set(),
    "workload.runtime": {"workload.contract", "workload.telemetry", "workload.leftovers"},
    "workload.engine": {"workload.contract", "workload.files", "workload.telemetry", *PROCESS},
    "workload.job": {"workload.contract", "workload.files", "workload.engine", "workload.telemetry", *PROCESS},
    "workload.bench": {"workload.contract", "workload.engine", "workload.telemetry", *PROCESS},
    "workload.serve": {
        "workload.contract",
        "workload.auth",
        "workload.engine",
        "workload.telemetry",
        "workload.bench",
        *PROCESS,
    },
    # The Batch API's app, service and store: the key mechanism and the job's contract, never the job (it runs
    # the job as a process), so the AWS front serves it where no engine is installed.
    "workload.batch_api": {"workload.contract", "workload.auth"},
    "workload.cli": {
        "workload.contract",
        "workload.auth",
        "workload.batch_api",
        "workload.files",
        "workload.engine",
        "workload.telemetry",
        "workload.job",
        "workload.serve",
        "workload.bench",
        *PROCESS,
    },
    "workload.__main__": {"workload.cli", "workload.contract"},
    "workload": set(),
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "workload" else parts[0]


def _against_the_layers(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    wrong: dict[str, list[str]] = {}
    for name, targets in graph.items():
        if not name.startswith("workload"):
            continue
        layer = _layer(name)
        allowed = WORKLOAD_LAYERS.get(layer, set()) | {layer}
        bad = sorted(t for t in targets if t.startswith("workload") and _layer(t) not in allowed)
        if bad:
            wrong[name] = bad
    return wrong


def test_every_workload_package_has_a_layer() -> None:
    assert {_layer(name) for name in _graph() if name.startswith("workload")} <= set(WORKLOAD_LAYERS)


def test_the_jobs_packages_import_only_down_the_layers() -> None:
    assert _against_the_layers(_graph()) == {}


def test_the_layer_check_finds_an_upward_import() -> None:
    """Not vacuous: telemetry importing the job, or the contract importing the engine, is caught."""
    graph = {"workload.telemetry.metrics": {"workload.job.attempt"}, "workload.contract.config": {"workload.engine"}}
    assert _against_the_layers(graph) == {
        "workload.telemetry.metrics": ["workload.job.attempt"],
        "workload.contract.config": ["workload.engine"],
    }


def test_the_contract_is_what_infra_may_import() -> None:
    """Every module of workload.contract is in the allowance, and the allowance is the contract package."""
    contract = {name for name in _graph() if _layer(name) == "workload.contract"}
    assert contract <= WORKLOAD_FOR_INFRA
    assert {n for n in WORKLOAD_FOR_INFRA if n != "workload"} == contract


def test_at_most_fifteen_modules_at_the_top_of_workload() -> None:
    top = [p.name for p in (ROOT / "workload").glob("*.py")]
    assert len(top) <= 15, sorted(top)


def test_no_product_module_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert long == {}


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    """The check above is not vacuous: a made-up circle of three modules is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _workload_packages() -> list[str]:
    return sorted(f"workload.{path.parent.name}" for path in (ROOT / "workload").glob("*/__init__.py"))


@pytest.mark.parametrize("package", _workload_packages())
def test_no_import_circle_inside_a_workload_package(package: str) -> None:
    """Each package's modules stand in layers of their own (the Batch API's service over its scheduler over its
    records, ...): none imports, even lazily, a module that imports it back."""
    graph = {name: {t for t in targets if _layer(t) == package} for name, targets in _graph().items()}
    assert _cycles({name: targets for name, targets in graph.items() if _layer(name) == package}) == []


# Members of other libraries' objects the job reaches on purpose, each with why; nothing of the job's own.
FOREIGN_PRIVATE_REACHES = {
    # os._exit is public (the documented exit without cleanup); the underscore is the C convention's.
    ("workload/runtime.py", "os._exit"),
    ("workload/serve/endpoint.py", "os._exit"),
    # Ray Data LLM's vLLM stage has no hook for the whole output or the output kind (workload/engine/guard.py).
    ("workload/engine/guard.py", "self.llm._generate_async"),
    ("workload/engine/guard.py", "self.llm._prepare_llm_request"),
    # Its LoRA routing downloads whatever a row's `model` names; the job routes by the config's adapters instead
    # (workload/engine/adapters.py).
    ("workload/engine/guard.py", "self.llm._maybe_get_lora_request"),
    # Ray tells the raylet's pid nowhere else (workload/leftovers.py).
    ("workload/leftovers.py", "worker._global_node"),
    # Dataset.repartition takes no Ray options, and its tasks' default of a whole CPU each starved the stages beside
    # a 2-CPU node's engine: the planned operator's own remote args are the one place to ask less
    # (workload/engine/pipeline.py, one_batch_per_block; docs/benchmark.md).
    ("workload/engine/pipeline.py", "cut._logical_plan"),
}


def _private_reaches(source: str) -> list[str]:
    """`x._member` where x is not the object itself (self, cls, super()), and `from workload... import _name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            own = own or (isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super")
            if not own:
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workload"):
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_reaches_into_anothers_private_members() -> None:
    """Every workload package is used through its public names: a module that calls another's `_update` (or
    imports its `_helper`) works around the interface instead of widening it."""
    reaches = {
        (str(path.relative_to(ROOT)), reach)
        for path in (ROOT / "workload").rglob("*.py")
        for reach in _private_reaches(path.read_text())
    }
    assert sorted(reaches - FOREIGN_PRIVATE_REACHES) == []


def test_the_private_member_check_finds_a_reach() -> None:
    """Not vacuous: another object's private method, a private import, but not the object's own or its parent's."""
    source = (
        "from workload.batch_api.store import _version\n"
        "def tick(service):\n    service._update(1)\n    return service.store._cas\n"
        "class A(B):\n    def f(self):\n        self._own()\n        super()._parent()\n"
    )
    assert sorted(_private_reaches(source)) == [
        "from workload.batch_api.store import _version",
        "service._update",
        "service.store._cas",
    ]


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
