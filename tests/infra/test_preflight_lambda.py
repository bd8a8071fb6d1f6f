"""Preflight's check of the Batch API functions' reserved concurrency against the account's Lambda quota (issue 60,
finding 4). The account's answers are replayed through botocore's Stubber, which checks each request against the
real API model (GetAccountSettings, GetFunctionConcurrency): an account's quota is AWS's, which no local server
holds as it is (moto answers GetAccountSettings with fixed numbers)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from infra import naming
from infra.components.batch_api import tick_function_name
from infra.config import load_stack_config
from infra.ops.preflight_account import skipped
from infra.ops.preflight_lambda import FUNCTION_SUFFIXES, check_reserved_concurrency, lambda_findings


def _lambda(total: int, unreserved: int, held: dict[str, int | None]) -> tuple[Any, Stubber]:
    client = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    limit = {"ConcurrentExecutions": total, "UnreservedConcurrentExecutions": unreserved}
    stub.add_response("get_account_settings", {"AccountLimit": limit}, {})
    for function, reserved in held.items():
        if reserved is None:
            stub.add_client_error("get_function_concurrency", "ResourceNotFoundException", http_status_code=404)
        else:
            answer = {"ReservedConcurrentExecutions": reserved}
            stub.add_response("get_function_concurrency", answer, {"FunctionName": function})
    stub.activate()
    return client, stub


def _config(http: int, tick: int = 1) -> Any:
    overrides = {"enabled": True, "http_reserved_concurrency": http, "tick_reserved_concurrency": tick}
    return load_stack_config("small", {"cost_center": "cc", "batch_api": overrides})


def test_the_function_names_are_the_programs() -> None:
    assert naming.child("small", FUNCTION_SUFFIXES[1]) == tick_function_name("small")


@pytest.mark.parametrize(
    ("total", "unreserved", "held", "ok", "said"),
    [
        # A new stack in an account at the default quota: 21 of 900 reservable.
        (1000, 1000, (None, None), True, "reserves 21 of the account's 1000 concurrent executions (900 may"),
        # A new account's quota of 10: nothing can be reserved (AWS keeps 100 unreserved).
        (10, 10, (None, None), False, "leaves 0 to reserve"),
        # Other functions hold 890 of 1000: 10 left to reserve, 21 wanted.
        (1000, 110, (None, None), False, "--quota-code L-B99A9384 --desired-value 1011"),
        # The stack deployed with the same reservations: they come back to the pool it draws on.
        (1000, 121, (20, 1), True, "(42 may be reserved"),
    ],
)
def test_reserved_concurrency_against_the_accounts_quota(
    total: int, unreserved: int, held: tuple[int | None, int | None], ok: bool, said: str
) -> None:
    names = [naming.child("small", suffix) for suffix in FUNCTION_SUFFIXES]
    client, stub = _lambda(total, unreserved, dict(zip(names, held, strict=True)))
    finding = check_reserved_concurrency(client, "small", _config(20))
    stub.assert_no_pending_responses()
    assert (finding.name, finding.ok) == ("lambda-concurrency", ok), finding.text
    assert said in finding.text, finding.text
    if not ok:
        assert "llm-batch:batch_api.http_reserved_concurrency" in finding.text


def test_lambda_is_asked_only_where_the_api_is_on() -> None:
    names = [naming.child("small", suffix) for suffix in FUNCTION_SUFFIXES]
    asked: list[str] = []

    def clients(service: str) -> Any:
        asked.append(service)
        return _lambda(1000, 1000, dict.fromkeys(names))[0]

    (finding,) = lambda_findings(_config(20), clients, "small")
    assert asked == ["lambda"] and (finding.name, finding.ok) == ("lambda-concurrency", True)
    assert "reserved concurrency" in skipped(_config(20))
    off = load_stack_config("small", {"cost_center": "cc"})
    assert lambda_findings(off, clients, "small") == [] and asked == ["lambda"]
    assert "reserved concurrency" not in skipped(off)
