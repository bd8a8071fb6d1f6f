"""The shared IAM pieces: service trust policies and the TLS-only statement, as every stack's plan uses them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.components.iam import deny_insecure_transport, service_trust
from infra.ops.plan_mocks import ACCOUNT_ID
from tests.infra.conftest import STACKS

Plan = list[dict[str, Any]]


def test_service_trust_without_account_lets_the_service_assume_the_role() -> None:
    assert json.loads(service_trust("ec2.amazonaws.com")) == {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }


def test_service_trust_with_account_pins_the_source_account() -> None:
    (statement,) = json.loads(service_trust("lambda.amazonaws.com", "123456789012"))["Statement"]
    assert statement["Principal"] == {"Service": "lambda.amazonaws.com"}
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_deny_insecure_transport_refuses_plain_http_to_everyone() -> None:
    statement = deny_insecure_transport("sqs:*", "arn:aws:sqs:us-east-1:123456789012:q")
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == "*"
    assert (statement["Action"], statement["Resource"]) == ("sqs:*", "arn:aws:sqs:us-east-1:123456789012:q")
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


@pytest.mark.parametrize("stack", STACKS)
def test_every_service_role_but_ec2_is_pinned_to_the_account(stack: str, plan_for: Callable[[str], Plan]) -> None:
    """Services acting for the stack (Lambda, Step Functions, Scheduler) only on this account's behalf."""
    roles = [item for item in plan_for(stack) if item["type"] == "aws:iam/role:Role"]
    service_roles = 0
    for role in roles:
        for statement in json.loads(role["inputs"]["assumeRolePolicy"])["Statement"]:
            services = statement.get("Principal", {}).get("Service")
            if not isinstance(services, str):
                continue  # web identity (IRSA) or EKS's own roles
            service_roles += 1
            if services.startswith("ec2."):
                assert "Condition" not in statement, role["name"]
            elif services.split(".")[0] in ("lambda", "states", "scheduler"):
                assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT_ID}}, role["name"]
    assert service_roles >= 3
