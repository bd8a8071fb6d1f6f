"""The internet-facing function's cancel and keys on AWS (issue 60, finding 6), over moto (S3, Secrets Manager,
Step Functions): its cancel stops no execution itself but asks the tick function, in an asynchronous invoke, and
the tick stops the run; a key secret holding a key under 32 characters fails the front's cold start."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from tests.workload.test_batch_api import _line
from tests.workload.test_batch_api_lambda import Front, stack  # noqa: F401 (the fixture, used by name)
from workload.auth.keys import KeyConfigError
from workload.batch_api import lambda_front

TICK = "llm-batch-small-batch-api-tick"


class StubbedLambda:
    """A boto3 session whose `lambda` client is a real client under botocore's Stubber: it stands in for Lambda's
    Invoke, which moto can serve only by running the function in Docker (none here). The Stubber checks each call
    against Lambda's own API model and answers as Lambda answers an `Event` invoke (202); every other client is
    the real one, on moto."""

    def __init__(self) -> None:
        self.lambda_client = boto3.client("lambda")
        self.stubber = Stubber(self.lambda_client)

    def client(self, service: str, **kwargs: Any) -> Any:
        return self.lambda_client if service == "lambda" else boto3.client(service, **kwargs)


def test_the_fronts_cancel_asks_the_tick_which_stops_the_run(stack: dict[str, str]) -> None:  # noqa: F811
    """Fails on main: the front stopped the execution itself (states:StopExecution on its own role)."""
    env = {**stack, "LLM_BATCH_TICK_FUNCTION": TICK}
    stubbed = StubbedLambda()
    front = Front(lambda_front.build_handler(env, stubbed))
    status, _, raw = front.call("POST", "/v1/files", files={"file": ("in.jsonl", _line("a").encode())},
                                data={"purpose": "batch"})  # fmt: skip
    assert status == 200, raw
    request = {"input_file_id": json.loads(raw)["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch_id = json.loads(front.call("POST", "/v1/batches", json=request)[2])["id"]
    tick = lambda_front.build_service(stack)  # the tick function's service: no LLM_BATCH_TICK_FUNCTION
    tick.tick()
    sfn, machine = boto3.client("stepfunctions"), stack["LLM_BATCH_STATE_MACHINE_ARN"]
    (running,) = sfn.list_executions(stateMachineArn=machine)["executions"]
    assert running["status"] == "RUNNING"

    expected = {
        "FunctionName": TICK,
        "InvocationType": "Event",
        "Payload": json.dumps({"stop_batch": batch_id}).encode(),
    }
    stubbed.stubber.add_response("invoke", {"StatusCode": 202}, expected)
    with stubbed.stubber:
        status, _, raw = front.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200 and json.loads(raw)["status"] == "cancelling", raw
    stubbed.stubber.assert_no_pending_responses()  # the one invoke, as expected
    assert sfn.describe_execution(executionArn=running["executionArn"])["status"] == "RUNNING"  # not stopped by it

    # The tick, given that event, stops the run; a repeated or late event stops nothing twice.
    assert tick.stop_cancelled(batch_id) == "stopping"
    assert sfn.describe_execution(executionArn=running["executionArn"])["status"] == "ABORTED"
    assert tick.stop_cancelled("batch_unknown") == "nothing to stop"


def test_a_short_key_in_the_secret_fails_the_cold_start(stack: dict[str, str]) -> None:  # noqa: F811
    """Fails on main: a key of one character was accepted."""
    boto3.client("secretsmanager").put_secret_value(
        SecretId=stack["LLM_BATCH_API_KEY_SECRET"], SecretString=json.dumps({"keys": [{"name": "team-a", "key": "x"}]})
    )
    with pytest.raises(KeyConfigError, match=r"shorter than 32 characters \(team-a\)"):
        lambda_front.build_handler(stack)


def test_a_cancel_whose_ask_fails_is_still_recorded_and_the_next_tick_stops_the_run(
    stack: dict[str, str],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Lambda throttles the invoke: the cancel still answers 200 `cancelling`, and the scheduled tick stops it."""
    stubbed = StubbedLambda()
    front = Front(lambda_front.build_handler({**stack, "LLM_BATCH_TICK_FUNCTION": TICK}, stubbed))
    status, _, raw = front.call("POST", "/v1/files", files={"file": ("in.jsonl", _line("a").encode())},
                                data={"purpose": "batch"})  # fmt: skip
    request = {"input_file_id": json.loads(raw)["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch_id = json.loads(front.call("POST", "/v1/batches", json=request)[2])["id"]
    tick = lambda_front.build_service(stack)
    tick.tick()
    stubbed.stubber.add_client_error("invoke", "TooManyRequestsException", http_status_code=429)
    with stubbed.stubber:
        status, _, raw = front.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200 and json.loads(raw)["status"] == "cancelling", raw
    assert f"batch {batch_id} cancelled; asking the tick failed" in capsys.readouterr().out
    sfn = boto3.client("stepfunctions")
    (running,) = sfn.list_executions(stateMachineArn=stack["LLM_BATCH_STATE_MACHINE_ARN"])["executions"]
    tick.tick()
    assert sfn.describe_execution(executionArn=running["executionArn"])["status"] == "ABORTED"
