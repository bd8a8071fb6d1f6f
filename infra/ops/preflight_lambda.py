"""Preflight for the Batch API's functions (issue 60): their reserved concurrency against the account's Lambda quota.

A function's reserved concurrency is taken from the account's concurrent executions, and AWS keeps at least 100 of
them unreserved: "Lambda reserves 100 units of concurrency for functions that don't have reserved concurrency"
(AWS Lambda Developer Guide, "Configuring reserved concurrency for a function", read 2026-12-06). A reservation
past that makes `pulumi up` fail at PutFunctionConcurrency after everything else was created; new accounts may
start with a quota of 10 concurrent executions, where no reservation fits at all.

Read with GetAccountSettings (`ConcurrentExecutions`, `UnreservedConcurrentExecutions`) and, for a stack already
deployed, GetFunctionConcurrency of its two functions: what they reserve now comes back to the pool they draw on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from infra import naming
from infra.ops.preflight_account import Finding

if TYPE_CHECKING:
    from infra.config import StackConfig

UNRESERVED_FLOOR = 100  # AWS keeps this much of the account's concurrency unreserved
# The functions' names as infra/components/batch_api.py makes them (naming.child(stack, f"batch-api-{suffix}")).
FUNCTION_SUFFIXES = ("batch-api-http", "batch-api-tick")
RAISE_QUOTA = (
    "aws service-quotas request-service-quota-increase --service-code lambda --quota-code L-B99A9384 "
    "--desired-value {value}"
)


def _reserved_now(client: Any, function: str) -> int:
    """What `function` reserves today; 0 when it does not exist yet or reserves nothing."""
    try:
        answer = client.get_function_concurrency(FunctionName=function)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return 0
        raise
    return int(answer.get("ReservedConcurrentExecutions") or 0)


def check_reserved_concurrency(client: Any, stack: str, config: StackConfig) -> Finding:
    wanted = config.batch_api.http_reserved_concurrency + config.batch_api.tick_reserved_concurrency
    settings = "llm-batch:batch_api.http_reserved_concurrency and tick_reserved_concurrency"
    try:
        limit = client.get_account_settings()["AccountLimit"]
        held = sum(_reserved_now(client, naming.child(stack, suffix)) for suffix in FUNCTION_SUFFIXES)
    except (ClientError, BotoCoreError) as error:
        return Finding("lambda-concurrency", False, f"reading the account's Lambda concurrency failed: {error}")
    total, unreserved = int(limit["ConcurrentExecutions"]), int(limit["UnreservedConcurrentExecutions"])
    room = unreserved + held - UNRESERVED_FLOOR  # what this stack may reserve, its own reservations given back
    if wanted <= room:
        return Finding(
            "lambda-concurrency",
            True,
            f"the Batch API reserves {wanted} of the account's {total} concurrent executions ({room} may be "
            f"reserved: AWS keeps {UNRESERVED_FLOOR} unreserved)",
        )
    return Finding(
        "lambda-concurrency",
        False,
        f"the Batch API would reserve {wanted} concurrent executions, but the account's quota of {total} leaves "
        f"{max(room, 0)} to reserve (AWS keeps {UNRESERVED_FLOOR} unreserved, other functions reserve "
        f"{total - unreserved - held}): lower {settings}, or raise the quota: "
        + RAISE_QUOTA.format(value=total + wanted - room),
    )


def lambda_findings(config: StackConfig, clients: Any, stack: str) -> list[Finding]:
    """The Batch API's functions' check where the API is on (`clients(service)` gives a boto3 client); else none."""
    if not config.batch_api.enabled:
        return []
    return [check_reserved_concurrency(clients("lambda"), stack, config)]
