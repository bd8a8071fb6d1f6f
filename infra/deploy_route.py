"""What a real `pulumi up` must have before it creates anything: a route to the EKS API it creates, and an alert
address that reaches someone. Each stops a real `up` with one line naming the key; the offline plan warns.

The route.

The same `up` that creates the cluster applies namespaces, charts and RBAC through its API server, from
wherever `pulumi up` runs. The one supported route (docs/deploy-eks.md): the public endpoint, open only to the
deployers' CIDRs in `llm-batch:eks.endpoint_public_access_cidrs`, beside the private endpoint that nodes and
the nightly run use. With no CIDRs the endpoint is private only, and an `up` from outside the VPC would create
the VPC and the cluster, then time out on the first Kubernetes object: it stops before creating anything.

The offline plan (`python -m infra.plan`, the Pulumi SDK's mocks) and `pulumi preview` only warn, so the
committed stacks still plan and a preview still shows what would be made.
"""

from __future__ import annotations

import pulumi

from infra.config import NAMESPACE, StackConfig

ROUTE_KEY = f"{NAMESPACE}:eks.endpoint_public_access_cidrs"
EMAIL_KEY = f"{NAMESPACE}:alert_email"
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
