"""Run one component under the plan's mocks, in this process, and return what it registered.

A mock is the only way to run Pulumi code here (no CLI, no provider plugins, no AWS account); the mocks are
the plan's own (`infra.ops.plan_mocks`), which answer with AWS-shaped ids and ARNs. Build components inside
`build`: resources created before `set_mocks` would be dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pulumi.runtime import set_mocks
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.aws_context import AwsContext
from infra.ops.plan_mocks import ACCOUNT_ID, PlanMocks
from infra.ops.plan_monitor import RecordingMonitor

REGION = "us-east-1"
CONTEXT = AwsContext(account_id=ACCOUNT_ID, partition="aws", region=REGION, dns_suffix="amazonaws.com")

Registrations = list[dict[str, Any]]


def register(build: Callable[[], None]) -> Registrations:
    mocks = PlanMocks(region=REGION)
    monitor = RecordingMonitor(mocks)
    set_mocks(mocks, project="llm-batch", stack="test", preview=False, monitor=monitor)
    _sync_await(run_pulumi_func(build))
    return [asdict(registration) for registration in monitor.registrations]


def of_type(registrations: Registrations, type_token: str) -> Registrations:
    return [item for item in registrations if item["type"] == type_token]


def one(registrations: Registrations, type_token: str, name: str | None = None) -> dict[str, Any]:
    """The single registration of that type (and name): an AssertionError listing what there is otherwise."""
    found = [item for item in of_type(registrations, type_token) if name is None or item["name"] == name]
    assert len(found) == 1, f"{len(found)} of {type_token} {name or ''}; have {[i['name'] for i in found]}"
    return found[0]
