"""What a real `pulumi up` must have before it creates anything: a route to the EKS API it creates, and an alert
address that reaches someone. Each stops a real `up` with one line naming the key; the offline plan warns.

The route.

The same `up` that creates the cluster applies namespaces, charts and RBAC through its API server, from
wherever `pulumi up` runs. The one supported route (docs/deploy-eks.md): the public endpoint, open only to the
deployers' CIDRs in `llm-batch:eks.endpoint_public_access_cidrs`, beside the private endpoint that nodes and
the nightly run use. With no CIDRs the endpoint is private only, and an `up` from outside the VPC would create
the VPC and the cluster, then time out on the first Kubernetes object: it stops before creating anything.

The policy pack.

With `llm-batch:policy_pack_required` true, a real `up` runs only with infra/policy_pack/ attached. A program
cannot ask the engine which policy packs run, and `--policy-pack` on the command line leaves no trace in the
program's process. What it can see is its environment, which it inherits from the CLI: the CLI takes every flag
from `PULUMI_OPTION_<FLAG>` too (Pulumi 3.208+), so `PULUMI_OPTION_POLICY_PACK=infra/policy_pack pulumi up`
both attaches the pack and tells the program so. It is a guard against forgetting the pack, not a control: a
`--policy-pack` flag beside the variable wins over it unseen, and whoever can run `up` can change the stack's
config. The control is an organisation's required policy packs in Pulumi Cloud (docs/deploy.md).

The offline plan (`python -m infra.plan`, the Pulumi SDK's mocks) and `pulumi preview` only warn, so the
committed stacks still plan and a preview still shows what would be made.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pulumi

from infra.config import NAMESPACE, StackConfig

ROUTE_KEY = f"{NAMESPACE}:eks.endpoint_public_access_cidrs"
EMAIL_KEY = f"{NAMESPACE}:alert_email"
POLICY_PACK_KEY = f"{NAMESPACE}:policy_pack_required"
# What the CLI reads `--policy-pack` from when the flag is not given (comma-separated, as repeated flags).
POLICY_PACK_ENV = "PULUMI_OPTION_POLICY_PACK"
POLICY_PACK_DIR = Path(__file__).resolve().parent / "policy_pack"
# Domains reserved for documentation and tests (RFC 2606, RFC 6761): mail to them never arrives, so the alerts
# topic's subscription is never confirmed and budget, alarm and failed-night mail reaches no one.
PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org")
PLACEHOLDER_SUFFIXES = (".example", ".test", ".invalid", ".localhost")


def route_problem(config: StackConfig) -> str | None:
    """The one line saying what to set, when the stack runs a cluster its deployer cannot reach; else None."""
    if config.tier == "small" or config.eks.endpoint_public_access_cidrs:
        return None
    return (
        f"no route from this deploy to the EKS API server (its endpoint would be private only): set {ROUTE_KEY} "
        "to the public CIDR of the machine running `pulumi up`, e.g. `pulumi config set --path "
        f"'{ROUTE_KEY}[0]' 203.0.113.7/32` (docs/deploy-eks.md)"
    )


def under_offline_plan() -> bool:
    """Whether the program runs under the SDK's mock monitor (the offline plan, tests), not a Pulumi engine."""
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.settings import get_monitor

    return isinstance(get_monitor(), MockMonitor)


def alert_email_problem(config: StackConfig) -> str | None:
    """The one line saying the alert address is a placeholder that no mail reaches; else None."""
    if config.alert_email is None:
        return None
    domain = config.alert_email.rsplit("@", 1)[-1].lower()
    if domain not in PLACEHOLDER_DOMAINS and not domain.endswith(PLACEHOLDER_SUFFIXES):
        return None
    return (
        f"{EMAIL_KEY} is {config.alert_email}, a placeholder no mail reaches (the alerts topic's subscription would "
        f"never be confirmed): set it to the on-call address, e.g. `pulumi config set {EMAIL_KEY} you@yourcompany.com`"
    )


def _names_the_pack(value: str, environ: Mapping[str, str]) -> bool:
    """Whether a `PULUMI_OPTION_POLICY_PACK` value names infra/policy_pack/: absolute, or relative to the shell
    that started the CLI (`PWD`), the repository root or this process's directory (Pulumi runs it in infra/)."""
    bases = [Path(environ["PWD"])] if environ.get("PWD") else []
    bases += [POLICY_PACK_DIR.parent.parent, Path.cwd()]
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        path = Path(entry)
        candidates = [path] if path.is_absolute() else [base / path for base in bases]
        if any(candidate.resolve() == POLICY_PACK_DIR for candidate in candidates):
            return True
    return False


def policy_pack_problem(config: StackConfig, environ: Mapping[str, str]) -> str | None:
    """The one line saying how to attach the pack, when the stack requires it and this run has not got it."""
    if not config.policy_pack_required or _names_the_pack(environ.get(POLICY_PACK_ENV, ""), environ):
        return None
    return (
        f"{POLICY_PACK_KEY} is true, and this run was not given the policy pack through {POLICY_PACK_ENV} (the "
        f"program cannot see a --policy-pack flag): run `{POLICY_PACK_ENV}=infra/policy_pack pulumi up` from the "
        "repository root, with the Pulumi CLI 3.208 or later (docs/deploy.md)"
    )


def _stop_or_warn(problem: str | None, *, offline: bool, dry_run: bool) -> None:
    """Stop a real `pulumi up` (pulumi.RunError: one line, no stack trace); warn under a preview or the plan."""
    if problem is None:
        return
    if offline or dry_run:
        pulumi.log.warn(problem)
        return
    raise pulumi.RunError(problem)


def require_route(config: StackConfig, *, offline: bool, dry_run: bool) -> None:
    """Stop a real `pulumi up` with no route; warn otherwise."""
    _stop_or_warn(route_problem(config), offline=offline, dry_run=dry_run)


def require_alert_email(config: StackConfig, *, offline: bool, dry_run: bool) -> None:
    """Stop a real `pulumi up` whose alerts would go to a placeholder address; warn otherwise."""
    _stop_or_warn(alert_email_problem(config), offline=offline, dry_run=dry_run)


def require_policy_pack(
    config: StackConfig, *, offline: bool, dry_run: bool, environ: Mapping[str, str] | None = None
) -> None:
    """Stop a real `pulumi up` of a stack that requires the policy pack and was not given it; warn otherwise."""
    problem = policy_pack_problem(config, os.environ if environ is None else environ)
    _stop_or_warn(problem, offline=offline, dry_run=dry_run)
