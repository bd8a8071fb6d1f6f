"""Plan check `store-keys`: every SNS topic, CloudWatch log group, Secrets Manager secret, SQS queue, DynamoDB
table, ECR repository and bucket encryption configuration of the plan, whoever adds it, is on the stack's key.

"The stack's key" is a key of one of the program's `llmbatch:kms:EncryptionKey` components on the same provider
(so the same account and region) as the resource: the stack key, or on the large tier the us-east-1 billing key
beside the billing alarms' topic there (a KMS key serves its own region only). A resource may name it by ARN,
id, or an alias of the plan that targets it. Refused: no key (each service's default: SNS and SQS unencrypted
or on service-owned keys, Logs on its own keys, DynamoDB on an AWS-owned key), an AWS-managed key
(`alias/aws/...`: its policy is AWS's, not the stack's, so any principal of the account with the service's
permissions can decrypt), a key of another stack or region, a key not in the plan.

One exception, where the stack key is not used and why: an SQS queue on SQS-managed encryption (SSE-SQS) that
carries only AWS's own events: its only senders are EventBridge rules matching `aws.*` sources (EC2 Spot and
state-change notices, AWS Health), no identity policy of the plan may send to it, and its queue policy admits no
one else. That is Karpenter's interruption queue: instance ids and event times, no data of the stack, as in
Karpenter's own reference setup (SqsManagedSseEnabled). A customer key there would need EventBridge and the
controller in the key policy, which is left for when the key gives EventBridge its own statement (issue 33).
Any other queue on SSE-SQS is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.rules.plan_view import (
    Plan,
    Resource,
    Rule,
    Violation,
    as_json,
    as_list,
    grants,
    label,
    of_type,
    principals,
    require_matches,
    statements,
)

NAME = "store-keys"
KEY = "aws:kms/key:Key"
ALIAS = "aws:kms/alias:Alias"
KEY_COMPONENT = "llmbatch:kms:EncryptionKey"
TOPIC = "aws:sns/topic:Topic"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
SECRET = "aws:secretsmanager/secret:Secret"
QUEUE = "aws:sqs/queue:Queue"
TABLE = "aws:dynamodb/table:Table"
REPOSITORY = "aws:ecr/repository:Repository"
BUCKET_ENCRYPTION = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
# The input naming each type's key, and what the service does when none is named.
KEY_INPUTS: dict[str, tuple[str, str]] = {
    TOPIC: ("kmsMasterKeyId", "no KMS key: the topic's messages are stored without the stack key"),
    LOG_GROUP: ("kmsKeyId", "no KMS key: the logs are on CloudWatch Logs' own keys, not the stack key"),
    SECRET: ("kmsKeyId", "no KMS key: the secret is on the AWS-managed aws/secretsmanager key"),
    QUEUE: ("kmsMasterKeyId", "no KMS key: the queue's messages are stored without the stack key"),
    TABLE: ("serverSideEncryption.kmsKeyArn", "no KMS key: the table is on an AWS-owned key"),
    # `images` and `buckets` ask for KMS; this rule asks whose key it is.
    REPOSITORY: ("encryptionConfigurations[].kmsKey", "no KMS key: the images are on ECR's own AES-256 keys"),
    BUCKET_ENCRYPTION: (
        "rules[].applyServerSideEncryptionByDefault.kmsMasterKeyId",
        "no KMS key: the bucket is on SSE-S3 or the AWS-managed aws/s3 key",
    ),
}
# The same stores declared through another provider: the rule cannot read their key, so they are refused.
UNREAD_TYPES = (
    "aws-native:sns:Topic",
    "aws-native:logs:LogGroup",
    "aws-native:secretsmanager:Secret",
    "aws-native:sqs:Queue",
    "aws-native:dynamodb:Table",
    "aws-native:dynamodb:GlobalTable",
)
EVENTBRIDGE = "events.amazonaws.com"
# Karpenter's reference queue policy also names sqs.amazonaws.com; neither service sends data of the stack.
AWS_EVENT_SENDERS = frozenset({EVENTBRIDGE, "sqs.amazonaws.com"})
QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
IAM_DOCUMENTS = ("aws:iam/policy:Policy", "aws:iam/rolePolicy:RolePolicy")


def stack_keys(plan: Plan) -> dict[str, dict[str, Resource]]:
    """provider URN -> every reference (ARN, id, alias name, alias ARN) of the stack's keys on that provider."""
    components = {item["urn"] for item in plan if item["type"] == KEY_COMPONENT}
    refs: dict[str, dict[str, Resource]] = {}
    by_ref: dict[str, Resource] = {}
    for key in of_type(plan, KEY):
        if key.get("parent") in components:
            found = {str(key.get("id")), str((key.get("outputs") or {}).get("arn"))}
            by_ref.update(dict.fromkeys(found, key))
            refs.setdefault(str(key.get("provider")), {}).update(dict.fromkeys(found, key))
    for alias in of_type(plan, ALIAS):
        target = by_ref.get(str(alias["inputs"].get("targetKeyId")))
        if target is not None:
            names = {str(alias["inputs"].get("name")), str((alias.get("outputs") or {}).get("arn"))}
            refs[str(target.get("provider"))].update(dict.fromkeys(names, target))
    return refs


def key_of(item: Resource) -> Any:
    """The key a store names, following its input path (`name[]`: the first entry of a list that names one)."""
    values: list[Any] = [item["inputs"]]
    for part in KEY_INPUTS[item["type"]][0].split("."):
        field = part.removesuffix("[]")
        values = [value.get(field) for value in values if isinstance(value, Mapping)]
        if part.endswith("[]"):
            values = [entry for value in values for entry in as_list(value)]
    return next((value for value in values if value), None)


def _name(item: Resource) -> Any:
    return (item.get("outputs") or {}).get("name") or item["inputs"].get("name")


def _aws_events_only(plan: Plan, queue: Resource) -> list[str]:
    """Why a queue on SSE-SQS is not one that carries only AWS's own events (empty: it is)."""
    arn = str((queue.get("outputs") or {}).get("arn"))
    url = str(queue.get("id"))
    reasons = []
    policies = [item for item in of_type(plan, QUEUE_POLICY) if item["inputs"].get("queueUrl") == url]
    allows = [s for item in policies for s in statements(item["inputs"].get("policy")) if s.get("Effect") == "Allow"]
    if not allows:
        reasons.append("no queue policy lets EventBridge send to it")
    for statement in allows:
        others = set(principals(statement, "AWS")) | (set(principals(statement, "Service")) - AWS_EVENT_SENDERS)
        if others:
            reasons.append(f"its policy lets {sorted(others)} in")
    senders = [
        item
        for item in of_type(plan, *IAM_DOCUMENTS)
        for statement in statements(item["inputs"].get("policy"))
        if grants(statement, "sqs:SendMessage") and {arn, "*"} & {str(r) for r in as_list(statement.get("Resource"))}
    ]
    reasons += [f"{label(item)} lets a role send to it" for item in senders]
    targets = [item for item in of_type(plan, TARGET) if item["inputs"].get("arn") == arn]
    if not targets:
        reasons.append("no EventBridge rule sends to it")
    rules = {item["urn"]: item for item in of_type(plan, RULE)}
    names = {str(_name(item)): item for item in rules.values() if _name(item)}
    for target in targets:
        rule = names.get(str(target["inputs"].get("rule"))) or next(
            (rules[urn] for urn in target.get("dependencies") or [] if urn in rules), None
        )
        pattern = as_json(rule["inputs"].get("eventPattern")) if rule else None
        sources = [str(source) for source in as_list(pattern.get("source"))] if isinstance(pattern, dict) else []
        if not sources or not all(source.startswith("aws.") for source in sources):
            reasons.append(f"{label(target)} sends it events not only from AWS (sources {sources or 'any'})")
    return reasons


def store_problems(item: Resource, keys: Mapping[str, Mapping[str, Resource]], plan: Plan) -> list[str]:
    key = key_of(item)
    if item["type"] == TABLE and not ((item["inputs"].get("serverSideEncryption") or {}).get("enabled")):
        return ["server-side encryption with a KMS key is off: the table is on an AWS-owned key"]
    if not key:
        if item["type"] == QUEUE and str(item["inputs"].get("sqsManagedSseEnabled")).lower() != "false":
            reasons = _aws_events_only(plan, item)
            if reasons:
                return [
                    "on SQS-managed encryption, not the stack key (allowed only for a queue of AWS's own events: "
                    + "; ".join(reasons)
                    + ")"
                ]
            return []
        return [KEY_INPUTS[item["type"]][1]]
    text = str(key)
    if text.startswith("alias/aws/") or ":alias/aws/" in text:
        return [f"on the AWS-managed key {text.rsplit(':', 1)[-1]}, whose policy the stack does not control"]
    own = keys.get(str(item.get("provider")), {})
    if text in own:
        return []
    elsewhere = [found for provider_keys in keys.values() for ref, found in provider_keys.items() if ref == text]
    if elsewhere:
        return [f"on {label(elsewhere[0])}, a key of this stack in another region or account: unusable here"]
    return [f"on key {text}, which is not a key of this stack's plan"]


def check_store_keys(plan: Plan) -> list[Violation]:
    keys = stack_keys(plan)
    stores = of_type(plan, *KEY_INPUTS)
    violations = [
        Violation(NAME, label(item), problem) for item in stores for problem in store_problems(item, keys, plan)
    ]
    for item in of_type(plan, *UNREAD_TYPES):
        violations.append(Violation(NAME, label(item), "a type whose encryption this rule does not read: use aws:*"))
    what = "topic, log group, secret, queue, table, repository or bucket encryption"
    require_matches(NAME, len(stores) + len(of_type(plan, *UNREAD_TYPES)), what)
    return violations


RULES: dict[str, Rule] = {
    NAME: Rule(
        check_store_keys,
        "name the stack key (the EncryptionKey component's key, or its alias) in the resource's KMS key input; "
        "its policy must let the service use it (infra/components/kms.py)",
    ),
}
