"""A stack as its file in stacks/ describes it: the raw config values, and the validated config they make.

The operator tools read stacks offline through here, exactly as Pulumi would pass them to the program.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.pricing.estimate import Estimate
    from infra.pricing.per_token import TokenCost

ROOT = Path(__file__).resolve().parents[2]
PROGRAM_DIR = ROOT / "infra"
STACKS_DIR = ROOT / "stacks"
PROJECT = "llm-batch"
DEFAULT_REGION = "us-east-1"


class PlanError(RuntimeError):
    """The stack could not be planned: a missing stack file, a config error or the program failing."""


def stack_file(stack: str) -> Path:
    """stacks/Pulumi.<stack>.yaml: where a stack's config lives."""
    return STACKS_DIR / f"Pulumi.{stack}.yaml"


def shown(path: Path) -> str:
    """A path as a reader finds it: relative to the repo where it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def with_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The stack file's `config:` with dotted `llm-batch:` keys set over it, as `pulumi config set --path` would:
    `serve.enabled=true` sets `enabled` inside the file's `llm-batch:serve` object (made if absent)."""
    merged = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        top, *path = dotted.split(".")
        full_key = top if ":" in top else f"{PROJECT}:{top}"
        if not path:
            merged[full_key] = value
            continue
        node = merged.setdefault(full_key, {})
        for part in path[:-1]:
            if not isinstance(node, dict):
                raise PlanError(f"--set {dotted}: {full_key} is not an object in the stack file")
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise PlanError(f"--set {dotted}: {full_key} is not an object in the stack file")
        node[path[-1]] = value
    return merged


def read_stack_config(stack: str, overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, str], list[str]]:
    """The stack file's `config:` as Pulumi passes it to a program: strings, objects as JSON; and secret keys.

    Encrypted (`secure:`) values cannot be decrypted offline; they are passed as a placeholder marked secret.
    `overrides` (dotted keys under `llm-batch:`) are set over the file first (`python -m infra.plan --set`).
    """
    path = stack_file(stack)
    if not path.is_file():
        known = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in STACKS_DIR.glob("Pulumi.*.yaml"))
        raise PlanError(f"no stack file {shown(path)}; stacks: {', '.join(known) or 'none'}")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PlanError(f"{shown(path)}: malformed YAML{where}: {getattr(error, 'problem', None) or error}") from None
    if not isinstance(document, dict):
        raise PlanError(f"{shown(path)} must hold a mapping with a `config:` key, not a {type(document).__name__}")
    raw = document.get("config") or {}
    if not isinstance(raw, dict):
        raise PlanError(f"{shown(path)}: `config:` must be a mapping")
    raw = with_overrides(raw, overrides or {})
    values: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in raw.items():
        full_key = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            values[full_key] = "offline-plan-placeholder"
            secret_keys.append(full_key)
        elif isinstance(value, dict | list):
            values[full_key] = json.dumps(value)
        elif isinstance(value, bool):
            values[full_key] = "true" if value else "false"
        else:
            values[full_key] = str(value)
    return values, secret_keys


def region_of(values: dict[str, str]) -> str:
    """The region a stack deploys to, as the program reads it from the config values."""
    return values.get(f"{PROJECT}:region") or values.get("aws:region") or DEFAULT_REGION


def offline_config(stack: str, overrides: Mapping[str, Any] | None = None) -> StackConfig:
    """The stack's validated config read from stacks/Pulumi.<stack>.yaml, as the program would see it."""
    from infra.config import decode_pulumi_values, load_stack_config

    values, _ = read_stack_config(stack, overrides)
    return load_stack_config(stack, decode_pulumi_values(values))


def stack_estimate(
    stack: str,
    plan: Iterable[dict[str, Any]] | None = None,
    overrides: Mapping[str, Any] | None = None,
    on: date | None = None,
    assume_free_tier: bool = True,
) -> Estimate:
    """The stack's monthly estimate at the repo's prices, for the month from `on` (default: today); with the
    account's always-free tier this stack's unless `assume_free_tier` is off (infra/pricing/idle_cost.py)."""
    from infra.pricing.batch_api_cost import with_front
    from infra.pricing.estimate import estimate
    from infra.pricing.idle_cost import with_idle
    from infra.pricing.stack_costs import estimate_inputs
    from infra.pricing.table import load_prices

    prices, config = load_prices(), offline_config(stack, overrides)
    plan = list(plan) if plan is not None else None
    result = estimate(estimate_inputs(stack, config, prices, plan, on, assume_free_tier), prices)
    return with_idle(with_front(result, config), config, plan, assume_free_tier)


def stack_per_token(
    stack: str,
    plan: Iterable[dict[str, Any]] | None = None,
    overrides: Mapping[str, Any] | None = None,
    on: date | None = None,
) -> list[TokenCost]:
    """The stack's cost per million output tokens, by model class and GPU pool (infra/pricing/per_token.py)."""
    from infra.pricing.estimate import estimate
    from infra.pricing.per_token import per_token_costs
    from infra.pricing.stack_costs import estimate_inputs
    from infra.pricing.table import load_prices

    prices = load_prices()
    inputs = estimate_inputs(stack, offline_config(stack, overrides), prices, plan, on)
    return per_token_costs(inputs, estimate(inputs, prices), prices)
