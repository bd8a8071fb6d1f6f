"""How `pulumi up` reaches the EKS API it creates, and the stop when it cannot.

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


def require_route(config: StackConfig, *, offline: bool, dry_run: bool) -> None:
    """Stop a real `pulumi up` with no route (pulumi.RunError: one line, no stack trace); warn otherwise."""
    problem = route_problem(config)
    if problem is None:
        return
    if offline or dry_run:
        pulumi.log.warn(problem)
        return
    raise pulumi.RunError(problem)
