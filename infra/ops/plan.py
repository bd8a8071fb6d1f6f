"""Offline plan: run the Pulumi program under mocks with a stack's config and show what it would create.

    python -m infra.plan small          # a tree on the terminal, then the stack's monthly cost estimate
    python -m infra.plan large --json   # a list of {type, name, parent, inputs, dependencies, ...} objects
    python -m infra.plan large --estimate-json   # the cost estimate's line items as JSON
    python -m infra.plan small --no-free-tier    # the estimate with no free alarms, dashboards or transitions

Every plan shown is gated by the policy rules (`infra.rules.registry.gate`): a violation is printed (resource,
rule, fix) and the command exits 1, after printing the plan so the mistake can be seen in it.
`--no-checks` skips that, for callers that run the checks themselves (`capture_plan`, `infra.policy`).

The program runs exactly as `pulumi up` would run it (infra/__main__.py as `__main__`, from infra/, with the
stack's `config:` from stacks/Pulumi.<stack>.yaml), but the engine and the AWS provider are the mocks of
`infra.ops.plan_mocks`, since no Pulumi CLI or AWS account is needed to read a plan. Secret values are masked.
`capture_plan(stack)` runs this in a subprocess, so each stack gets a fresh Pulumi runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import date
from typing import TYPE_CHECKING, Any

import yaml

# Re-exported: tests and tools plan a stack through this module.
from infra.ops.plan_capture import capture_plan as capture_plan
from infra.ops.stacks import (
    DEFAULT_REGION,
    PROGRAM_DIR,
    PROJECT,
    PlanError,
    read_stack_config,
    region_of,
)

if TYPE_CHECKING:
    from infra.ops.plan_mocks import PlanMocks


def run_under_mocks(
    build: Callable[[], object],
    *,
    stack: str,
    region: str = DEFAULT_REGION,
    config: Mapping[str, str] | None = None,
    secret_keys: Sequence[str] = (),
    mocks: PlanMocks | None = None,
) -> list[dict[str, Any]]:
    """Run `build` (a program, or a test's few components) under the plan's mocks; its registrations, sorted.

    Safe to call repeatedly in one process (component tests do): each call sets fresh config and mocks first,
    since resources registered before `set_mocks` would be dropped.
    """
    from pulumi.runtime import set_all_config, set_mocks
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from infra.ops.plan_mocks import PlanMocks
    from infra.ops.plan_monitor import RecordingMonitor

    set_all_config(dict(config or {}), list(secret_keys))
    mocks = mocks or PlanMocks(region=region)
    monitor = RecordingMonitor(mocks)
    set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)

    def program() -> None:
        build()  # what it returns (a component, say) is of no interest; its registrations are

    _sync_await(run_pulumi_func(program))
    # Registrations arrive in whatever order their inputs resolve; sort so two runs of a plan compare equal.
    return sorted((asdict(registration) for registration in monitor.registrations), key=lambda item: item["urn"])


def run_program(
    stack: str, mocks: PlanMocks | None = None, overrides: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Run the Pulumi program under mocks with the stack's config (`overrides` set over it), in this process.

    Call once per process: a program's module-level state (and Pulumi's) is not meant to run twice.
    """
    values, secret_keys = read_stack_config(stack, overrides)

    def program() -> None:
        # As Pulumi's Python host runs `main: infra/`: from that folder, with it first on sys.path.
        cwd = os.getcwd()
        os.chdir(PROGRAM_DIR)
        try:
            runpy.run_path(str(PROGRAM_DIR), run_name="__main__")
        finally:
            os.chdir(cwd)

    registrations = run_under_mocks(
        program, stack=stack, region=region_of(values), config=values, secret_keys=secret_keys, mocks=mocks
    )
    return [*registrations, _stack_exports(stack)]


def _stack_exports(stack: str) -> dict[str, Any]:
    """The program's exports (`pulumi.export`) as one plan item of type pulumi:pulumi:Stack, secrets masked.

    Under mocks the root stack registers its outputs before the program runs, so they are read back from it.
    """
    import pulumi
    from pulumi.runtime.settings import get_root_resource
    from pulumi.runtime.sync_await import _sync_await

    from infra.rules.plan_view import SECRET_MASK

    root = get_root_resource()
    exports: dict[str, Any] = {}
    for key, value in sorted(getattr(root, "outputs", {}).items()):
        output = pulumi.Output.from_input(value)
        exports[key] = SECRET_MASK if _sync_await(output.is_secret()) else _sync_await(output.future())
    name = f"{PROJECT}-{stack}"
    return {
        "urn": f"urn:pulumi:{stack}::{PROJECT}::pulumi:pulumi:Stack::{name}",
        "type": "pulumi:pulumi:Stack",
        "name": name,
        "parent": None,
        "custom": False,
        "provider": None,
        "inputs": {},
        "id": None,
        "outputs": exports,
        "dependencies": [],
    }


_GROUPS = ("pulumi:pulumi:Stack", "llmbatch:foundation:Foundation", "llmbatch:eks_tier:EksTier")


def summary(plan: list[dict[str, Any]]) -> str:
    """One line: resources by top-level component, then by type (most first), so a reader sees the plan's shape."""
    by_urn = {item["urn"]: item for item in plan}

    def component_of(item: dict[str, Any]) -> str:
        # The concern's component: walk up the parents until the next one up is the stack or a grouping of
        # concerns (the foundation, the EKS tier), which would hide the concerns' shares.
        while (parent := by_urn.get(item["parent"])) is not None and parent["type"] not in _GROUPS:
            item = parent
        return str(item["name"]) if not item["custom"] else "(stack)"

    resources = [item for item in plan if item["custom"]]
    components = Counter(component_of(item) for item in resources)
    # By service (`aws:iam/role:Role` -> aws:iam): a full type list is the --json plan's job.
    types = Counter(item["type"].split("/")[0] for item in resources)

    def counted(counts: Counter[str]) -> str:
        return ", ".join(f"{name} {count}" for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    return (
        f"{len(resources)} resources in {len(plan) - len(resources)} components."
        f" By component: {counted(components)}. By service: {counted(types)}."
    )


def render_tree(plan: list[dict[str, Any]], details: bool = True) -> str:
    """Each resource under its parent (`type  name`, by URN); with `details`, Kubernetes objects' full manifests."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    urns = {item["urn"] for item in plan}
    for item in plan:
        parent = item["parent"] if item["parent"] in urns else None
        children.setdefault(parent, []).append(item)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for item in children.get(parent, []):
            lines.append(f"{'  ' * depth}{'+' if item['custom'] else '*'} {item['type']}  {item['name']}")
            if details and item["custom"] and item["type"].startswith("kubernetes:") and item["inputs"]:
                # Kubernetes objects are shown whole: their manifest is what the cluster will be asked to run.
                manifest = yaml.safe_dump(item["inputs"], sort_keys=False).rstrip().splitlines()
                lines.extend(f"{'  ' * (depth + 2)}{line}" for line in manifest)
            walk(item["urn"], depth + 1)

    walk(None, 0)
    lines.append("\n(+ resource, * component)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from workload.contract.cli_errors import HELP_EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m infra.plan",
        description=__doc__.splitlines()[0],
        epilog="examples: python -m infra.plan small; python -m infra.plan large --details; "
        f"python -m infra.plan medium --json. {HELP_EPILOG}",
    )
    parser.add_argument("stack", help="stack name: stacks/Pulumi.<stack>.yaml holds its config")
    parser.add_argument("--json", action="store_true", help="print the plan as a JSON list of resources")
    parser.add_argument("--estimate-json", action="store_true", help="print the monthly cost estimate as JSON")
    parser.add_argument("--details", action="store_true", help="show Kubernetes objects' full manifests in the tree")
    parser.add_argument(
        "--on",
        type=_day,
        metavar="YYYY-MM-DD",
        help="price the month from this day (default: today, UTC): what EKS support window the version is in",
    )
    parser.add_argument(
        "--no-free-tier",
        action="store_true",
        help="price every unit: no free alarms, dashboards or Step Functions transitions (an account whose "
        "always-free tier other stacks use up; infra/pricing/idle_cost.py)",
    )
    parser.add_argument(
        "--no-checks", action="store_true", help="skip the policy gate (the caller runs `infra.policy` itself)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="plan with this llm-batch: key set over the stack file (dotted, the value read as YAML), e.g. "
        "--set serve.enabled=true; repeatable",
    )
    args = parser.parse_args(argv)
    from pulumi import RunError

    from infra.config import StackConfigError

    try:
        overrides = parse_sets(args.set)
        plan = run_program(args.stack, overrides=overrides)
    except (PlanError, StackConfigError, RunError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from infra.ops.stacks import stack_estimate
    from infra.pricing.estimate import format_estimate
    from infra.pricing.table import PriceTableError

    checked = 0 if args.no_checks else _gate(plan)
    if not args.no_checks:
        checked = max(checked, _engine_fit(args.stack, overrides))
    if args.json:
        json.dump(plan, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return checked
    try:
        cost = stack_estimate(args.stack, plan, overrides, on=args.on, assume_free_tier=not args.no_free_tier)
    except PriceTableError as error:
        if args.estimate_json:  # the estimate is all that was asked for
            print(f"error: cost estimate: {error}", file=sys.stderr)
            return 2
        # A missing price should not hide the plan: show it, say what is missing and how to add it.
        print(render_tree(plan, details=args.details))
        print(summary(plan))
        _print_preview_line(plan, args.no_checks)
        _print_night_lines(args.stack, overrides)
        print(f"\nwarning: no cost estimate: {error}")
        print(f"warning: no cost estimate: {error}", file=sys.stderr)
        return checked
    from infra.ops.stacks import stack_per_token
    from infra.pricing.per_token import format_per_token

    per_token = stack_per_token(args.stack, plan, overrides, on=args.on)
    if args.estimate_json:
        tokens = [row.model_dump(mode="json") for row in per_token]
        report = {**cost.model_dump(mode="json"), "total_usd": round(cost.total, 2), "per_1m_output_tokens": tokens}
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render_tree(plan, details=args.details))
        print(summary(plan))
        _print_preview_line(plan, args.no_checks)
        _print_night_lines(args.stack, overrides)
        print()
        print(format_estimate(cost))
        print()
        print(format_per_token(per_token))
    return checked


def _print_preview_line(plan: list[dict[str, Any]], no_checks: bool) -> None:
    """Which rules only a real `pulumi up` can judge (infra.rules.registry.preview_line), under the plan it gated."""
    from infra.rules.registry import preview_line

    line = None if no_checks else preview_line(plan)
    if line:
        print(line)


def _print_night_lines(stack: str, overrides: Mapping[str, Any]) -> None:
    """The night's worker group and the eight-GPU pools' regional types, with or without an estimate."""
    for line in (night_workers_line(stack, overrides), eight_gpu_types_line(stack, overrides)):
        if line:
            print(line)


def night_workers_line(stack: str, overrides: Mapping[str, Any]) -> str | None:
    """Which GPU worker group the stack's model runs the night on (infra/config/worker_groups.py), on the EKS
    tiers; None on the small tier."""
    from infra.ops.stacks import offline_config

    config = offline_config(stack, overrides)
    if config.tier == "small":
        return None
    tp = config.job_config("s3://plan/input/", "s3://plan/output/").engine.tensor_parallel_size
    return f"night's workers: {config.night_workers.describe(tp)}"


def eight_gpu_types_line(stack: str, overrides: Mapping[str, Any]) -> str | None:
    """Whether the eight-GPU pools list p5.48xlarge in the stack's region, and why (infra/config/regional_types.py)."""
    from infra.config.regional_types import choice_line
    from infra.ops.stacks import offline_config

    return choice_line(offline_config(stack, overrides))


def _engine_fit(stack: str, overrides: Mapping[str, Any]) -> int:
    """1 when the stack's model cannot fit a GPU its run may launch (infra/ops/checks_engine_fit.py), said on stderr."""
    from infra.ops.checks_engine_fit import check_engine_fit
    from infra.ops.stacks import offline_config
    from infra.pricing.table import load_prices

    fit = check_engine_fit(offline_config(stack, overrides), load_prices())
    if not fit.ok:
        print(f"error: {fit.line}", file=sys.stderr)
    return 0 if fit.ok else 1


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date like 2026-12-01") from None


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs of `--set` as overrides; each value is read as YAML (true, 3, [a, b], {x: 1})."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(f"--set {item!r}: expected KEY=VALUE, e.g. serve.enabled=true")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise PlanError(f"--set {item!r}: the value is not YAML: {error}") from None
    return overrides


def _gate(plan: list[dict[str, Any]]) -> int:
    """1 (and the violations on stderr) when the plan breaks a policy rule, else 0."""
    from infra.rules.plan_view import NothingMatched
    from infra.rules.registry import PolicyError, gate

    try:
        gate(plan)
    except (PolicyError, NothingMatched) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
