"""The data bucket's lifecycle rules against what the Batch API and the queue really write (issue 61): every key
they leave in the bucket, old versions and delete markers included, is under a rule that deletes its old versions
and its markers, on every tier's plan; the rules keep AWS's own constraints; and the retention they state is the
one the API runs with (infra/components/bucket_retention.py).

The keys are not listed by hand: the AWS front's service (workload.batch_api.lambda_front.build_service, as the
functions build it) uploads, uploads in parts, makes a batch, ticks and deletes on the moto server's versioned
bucket, and the test reads back every version it left.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from infra.components import bucket_retention
from infra.components.batch_api import API_PREFIX
from infra.components.nightly_roles import RUN_REQUEST_KEY
from tests.infra.conftest import TIER_STACKS
from tests.infra.nightly_aws import ROLE_ARN
from workload.batch_api import lambda_front
from workload.batch_api.objects import DEFAULT_RETENTION_S

Plan = list[dict[str, Any]]
LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
OWNER = "project"


def _line(custom_id: str) -> bytes:
    body = {"model": "llm-batch", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return (
        json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
    ).encode()


def _stack(moto_endpoint: str) -> tuple[dict[str, str], str]:
    """A stack's versioned bucket (as DataBucket makes it) and a state machine the tick can start."""
    name = secrets.token_hex(4)
    bucket = f"llm-batch-{name}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    definition = {"StartAt": "Run", "States": {"Run": {"Type": "Wait", "Seconds": 86400, "End": True}}}
    machine = boto3.client("stepfunctions").create_state_machine(
        name=f"llm-batch-{name}-nightly", definition=json.dumps(definition), roleArn=ROLE_ARN
    )
    env = {
        "LLM_BATCH_BUCKET": bucket,
        "LLM_BATCH_API_PREFIX": API_PREFIX,
        "LLM_BATCH_STATE_MACHINE_ARN": machine["stateMachineArn"],
        "LLM_BATCH_MODEL": "llm-batch",
        "AWS_REGION": "us-east-1",
    }
    return env, bucket


@pytest.fixture(scope="module")
def written_keys(moto_endpoint: str) -> set[str]:
    """Every key (current, old version or delete marker) the API and the queue leave in the bucket."""
    env, bucket = _stack(moto_endpoint)
    service = lambda_front.build_service(env, boto3.Session())
    data = _line("a") + _line("b")
    kept = service.upload_file(OWNER, "in.jsonl", "batch", [data])
    upload = service.create_upload(
        OWNER, {"bytes": len(data), "filename": "parts.jsonl", "mime_type": "application/jsonl", "purpose": "batch"}
    )
    part = service.add_upload_part(OWNER, upload["id"], [data])
    assembled = service.complete_upload(OWNER, upload["id"], [part["id"]], None)["file"]
    batch = service.create_batch(OWNER, kept["id"], "/v1/chat/completions", "24h", idempotency_key="retry-1")
    service.tick()  # starts the batch's run: the executor's slot and markers
    service.cancel_batch(OWNER, batch["id"])
    service.tick()
    service.delete_file(OWNER, assembled["id"])
    s3 = boto3.client("s3")
    keys: set[str] = set()
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        keys |= {item["Key"] for item in page.get("Versions", []) + page.get("DeleteMarkers", [])}
    record = json.loads(
        s3.get_object(Bucket=bucket, Key=f"{API_PREFIX}records/batch/{batch['id']}.json")["Body"].read()
    )
    # Written by the batch's job, which does not run here: where its record says its output goes.
    keys.add(f"{API_PREFIX}{record['_output_key']}/summary.json")
    keys.add(RUN_REQUEST_KEY)  # written by the small tier's state machine for each run
    return keys


def _rules(plan: Plan) -> list[dict[str, Any]]:
    (lifecycle,) = [item for item in plan if item["type"] == LIFECYCLE]
    return [rule for rule in lifecycle["inputs"]["rules"] if rule["status"] == "Enabled"]


def _covering(rules: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [rule for rule in rules if key.startswith(rule["filter"]["prefix"])]


def test_the_service_left_old_versions_and_markers_to_clean(written_keys: set[str]) -> None:
    """Not vacuous: the keys read back hold records, both kinds of body, upload parts and the control key."""
    wanted = ("records/batch/", "records/file/", "files/", "uploads/", "batches/")
    assert all(any(key.startswith(API_PREFIX + part) for key in written_keys) for part in wanted), written_keys
    assert RUN_REQUEST_KEY in written_keys


@pytest.mark.parametrize("stack", TIER_STACKS)
def test_every_written_key_loses_its_old_versions_and_markers(
    stack: str, features_on: Callable[[str], Plan], written_keys: set[str]
) -> None:
    rules = _rules(features_on(stack))
    for key in sorted(written_keys):
        covering = _covering(rules, key)
        noncurrent = [
            r["noncurrentVersionExpiration"]["noncurrentDays"] for r in covering if "noncurrentVersionExpiration" in r
        ]
        assert noncurrent and min(noncurrent) == bucket_retention.DELETED_KEPT_DAYS, (key, covering)
        markers = [r for r in covering if r.get("expiration", {}).get("expiredObjectDeleteMarker") is True]
        assert markers, f"{key}: its delete markers stay forever"
        aborts = [
            r["abortIncompleteMultipartUpload"]["daysAfterInitiation"]
            for r in covering
            if "abortIncompleteMultipartUpload" in r
        ]
        assert aborts == [bucket_retention.ABORT_UPLOADS_DAYS], (key, covering)


@pytest.mark.parametrize("stack", TIER_STACKS)
def test_the_bodies_go_after_the_retention_and_no_record_does(
    stack: str, features_on: Callable[[str], Plan], written_keys: set[str]
) -> None:
    rules = _rules(features_on(stack))

    def current_days(key: str) -> list[float]:
        return [r["expiration"]["days"] for r in _covering(rules, key) if "days" in r.get("expiration", {})]

    for key in written_keys:
        days = current_days(key)
        if key.startswith((f"{API_PREFIX}files/", f"{API_PREFIX}batches/")):
            assert days == [bucket_retention.BODY_BACKSTOP_DAYS], key
        elif key.startswith(f"{API_PREFIX}uploads/"):
            assert days == [1], key
        else:  # records, the executor's execution markers, the run request: never by age
            assert days == [], key


@pytest.mark.parametrize("stack", TIER_STACKS)
def test_the_rules_keep_aws_constraints(stack: str, features_on: Callable[[str], Plan]) -> None:
    rules = _rules(features_on(stack))
    assert len({rule["id"] for rule in rules}) == len(rules)
    for rule in rules:
        expiration = rule.get("expiration", {})
        # One Expiration never holds both (S3's LifecycleExpiration: refused).
        assert not (expiration.get("expiredObjectDeleteMarker") and ("days" in expiration or "date" in expiration))
        days = [expiration.get("days"), rule.get("noncurrentVersionExpiration", {}).get("noncurrentDays")]
        assert all(d is None or (d >= 1 and d == int(d)) for d in days), rule


def test_the_rules_state_the_retention_the_api_runs_with() -> None:
    assert bucket_retention.RETENTION_DAYS * 86400 == DEFAULT_RETENTION_S
    assert bucket_retention.BODY_BACKSTOP_DAYS > bucket_retention.RETENTION_DAYS + 1  # the window and a slow tick


def test_s3_takes_the_rules(moto_endpoint: str, features_on: Callable[[str], Plan]) -> None:
    """The small plan's whole configuration put on the moto server's bucket and read back unchanged."""
    rules = _rules(features_on("small"))
    bucket = f"llm-batch-{secrets.token_hex(4)}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [_boto(r) for r in rules]})
    stored = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert sorted(rule["ID"] for rule in stored) == sorted(rule["id"] for rule in rules)


def _boto(rule: dict[str, Any]) -> dict[str, Any]:
    """The plan's rule (the provider's camelCase inputs) as S3's API spells it."""
    out: dict[str, Any] = {"ID": rule["id"], "Status": rule["status"], "Filter": {"Prefix": rule["filter"]["prefix"]}}
    if "expiration" in rule:
        exp = rule["expiration"]
        out["Expiration"] = {"Days": int(exp["days"])} if "days" in exp else {"ExpiredObjectDeleteMarker": True}
    if "noncurrentVersionExpiration" in rule:
        out["NoncurrentVersionExpiration"] = {
            "NoncurrentDays": int(rule["noncurrentVersionExpiration"]["noncurrentDays"])
        }
    for transition in rule.get("transitions", []):
        out.setdefault("Transitions", []).append(
            {"Days": int(transition["days"]), "StorageClass": transition["storageClass"]}
        )
    for transition in rule.get("noncurrentVersionTransitions", []):
        out.setdefault("NoncurrentVersionTransitions", []).append(
            {"NoncurrentDays": int(transition["noncurrentDays"]), "StorageClass": transition["storageClass"]}
        )
    if "abortIncompleteMultipartUpload" in rule:
        days = int(rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"])
        out["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return out
