"""What the Batch API's tick asks of S3 while its queue is idle, the figure the estimate bills every tick for
(infra/pricing/batch_api_requests.py: the open-batches index, no listing; issue 61, after issue 65's finding 6).

The real tick (workload.batch_api.lambda_front.build_service, as the tick function builds it) runs against the moto
server's S3 and Step Functions; its requests are counted on the client, each page of a listing one request.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from typing import Any

import boto3

from infra.pricing.batch_api_requests import FUNCTION_INDEX_GETS, TICK_LISTS
from tests.infra.nightly_aws import ROLE_ARN
from workload.batch_api import lambda_front

# What S3 bills as a LIST (with PUT, COPY, POST) and as a GET (with HEAD and the rest).
LISTS = {"ListObjectsV2", "ListObjects", "ListObjectVersions"}
GETS = {"GetObject", "HeadObject"}


def _counted_session() -> tuple[boto3.Session, Counter[str]]:
    session, calls = boto3.Session(), Counter[str]()

    def count(event_name: str, **_: Any) -> None:
        calls[event_name.rsplit(".", 1)[-1]] += 1

    session.events.register("before-call.s3", count)
    return session, calls


def _idle_stack(moto_endpoint: str) -> dict[str, str]:
    """A stack's bucket and state machine with nothing queued: what the tick finds on a night with no batch."""
    name = secrets.token_hex(4)
    bucket = f"llm-batch-{name}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    definition = {"StartAt": "Run", "States": {"Run": {"Type": "Wait", "Seconds": 86400, "End": True}}}
    machine = boto3.client("stepfunctions").create_state_machine(
        name=f"llm-batch-{name}-nightly", definition=json.dumps(definition), roleArn=ROLE_ARN
    )
    return {
        "LLM_BATCH_BUCKET": bucket,
        "LLM_BATCH_STATE_MACHINE_ARN": machine["stateMachineArn"],
        "LLM_BATCH_MODEL": "llm-batch",
        "LLM_BATCH_METRICS_NAMESPACE": "LLMBatch",
        "LLM_BATCH_STACK": "test",
        "AWS_REGION": "us-east-1",
    }


# The estimate follows issue 61's design (the open-batches index, workload/batch_api/batch_index.py): a tick's
# requests counted here are the ones infra/pricing/batch_api_requests.py bills.
def test_an_idle_tick_makes_the_requests_the_estimate_bills(moto_endpoint: str) -> None:
    session, calls = _counted_session()
    stack = _idle_stack(moto_endpoint)
    service, metrics = lambda_front.build_service(stack, session), lambda_front.build_metrics(stack)
    lambda_front._tick(service, metrics)  # the first tick, on an empty bucket
    calls.clear()
    for _ in range(3):  # a steady idle queue: the same requests every tick, its metrics line included
        lambda_front._tick(service, metrics)
    assert sum(calls.values()) > 0, "the tick asked nothing of S3: the count would prove nothing"
    lists = sum(count for call, count in calls.items() if call in LISTS)
    gets = sum(count for call, count in calls.items() if call in GETS)
    assert set(calls) <= LISTS | GETS, f"an idle tick wrote to S3: {dict(calls)}"
    assert (lists / 3, gets / 3) == (TICK_LISTS, FUNCTION_INDEX_GETS), dict(calls)
