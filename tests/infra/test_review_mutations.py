"""Mutation suite of the security review (issue 67): the mistakes the gate passed, each caught by its rule.

A review injected realistic mistakes into fresh plans; these are the ones no rule refused: wildcards taken as
naming the caller, data and trust sent to another account, a PRIVATE API open to every VPC, an internet-facing
load balancer, an unencrypted volume, and the internet let in as two halves. Each starts from the plan with every
opt-in feature on (`features_on`: the Batch API's front, serving), asserts the named rule reports the named
resource, that the pack's `validate` says the same, and that the gate refuses the plan. The account and ARNs are
made up (999999999999 is nobody's).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.rules import checks_cross_account, checks_iam, registry
from tests.infra.mutation_check import Mutation, assert_caught
from tests.infra.test_added_resource_mutations import add

Plan = list[dict[str, Any]]
ACCOUNT = "123456789012"
OTHER = "999999999999"
REGION = "us-west-2"


def _named(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and item["name"] == name]
    assert len(found) == 1, f"expected one {type_token} {name}"
    return found[0]


def _append(item: dict[str, Any], key: str, statement: dict[str, Any]) -> None:
    document = json.loads(item["inputs"][key])
    document["Statement"].append(statement)
    item["inputs"][key] = json.dumps(document)


# --- wildcards taken as naming the caller ---------------------------------------------------------------------


def bucket_readable_by_any_accounts_roles(plan: Plan) -> None:
    """`arn:aws:iam::*:role/*` reads as "our roles" and is every role of every account: a public bucket."""
    bucket = _named(plan, "aws:s3/bucket:Bucket", "storage-bucket")["outputs"]["arn"]
    statement = {
        "Sid": "RolesRead",
        "Effect": "Allow",
        "Principal": "*",
        "Action": "s3:GetObject",
        "Resource": f"{bucket}/*",
        "Condition": {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:role/*"}},
    }
    _append(_named(plan, "aws:s3/bucketPolicy:BucketPolicy", "storage-tls-only"), "policy", statement)


def role_assumable_by_any_organisation(plan: Plan) -> None:
    statement = {
        "Sid": "OrgAssumes",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": "sts:AssumeRole",
        "Condition": {"StringLike": {"aws:PrincipalOrgID": "o-*"}},
    }
    _append(_named(plan, "aws:iam/role:Role", "cost-report-role"), "assumeRolePolicy", statement)


def key_decrypt_for_any_organisation(plan: Plan) -> None:
    statement = {
        "Sid": "OrgDecrypts",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": "kms:Decrypt",
        "Resource": "*",
        "Condition": {"StringLike": {"aws:PrincipalOrgID": "o-*"}},
    }
    _append(_named(plan, "aws:kms/key:Key", "kms-key"), "policy", statement)


def interruption_queue_open_to_any_accounts_rules(plan: Plan) -> None:
    policy = _named(plan, "aws:sqs/queuePolicy:QueuePolicy", "karpenter-interruptions-policy")
    document = json.loads(policy["inputs"]["policy"])
    document["Statement"][0]["Condition"] = {"ArnLike": {"aws:SourceArn": f"arn:aws:events:{REGION}:*:rule/*"}}
    policy["inputs"]["policy"] = json.dumps(document)


def api_lambda_invocable_from_any_api(plan: Plan) -> None:
    permission = _named(plan, "aws:lambda/permission:Permission", "batch-api-invoke-from-api")
    permission["inputs"]["sourceArn"] = "arn:aws:execute-api:*:*:*/*/*"


# --- cross-account paths --------------------------------------------------------------------------------------


def key_granted_to_another_account(plan: Plan) -> None:
    key = _named(plan, "aws:kms/key:Key", "kms-key")["outputs"]["arn"]
    inputs = {"keyId": key, "granteePrincipal": f"arn:aws:iam::{OTHER}:role/reader", "operations": ["Decrypt"]}
    add(plan, checks_cross_account.GRANT, "reader-grant", inputs)


def bucket_replicated_to_another_account(plan: Plan) -> None:
    bucket = _named(plan, "aws:s3/bucket:Bucket", "storage-bucket")
    rule = {
        "id": "backup",
        "status": "Enabled",
        "destination": {"bucket": "arn:aws:s3:::someone-elses-backup", "account": OTHER},
    }
    inputs = {"bucket": bucket["id"], "role": f"arn:aws:iam::{ACCOUNT}:role/replication", "rules": [rule]}
    add(plan, checks_cross_account.REPLICATION, "backup-replication", inputs)


def logs_subscribed_to_another_account(plan: Plan) -> None:
    inputs = {
        "logGroup": "/llm-batch/large/job",
        "filterPattern": "",
        "destinationArn": f"arn:aws:logs:{REGION}:{OTHER}:destination:central-logs",
    }
    add(plan, checks_cross_account.SUBSCRIPTION, "central-logs", inputs)


def cognito_trust_without_conditions(plan: Plan) -> None:
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": "cognito-identity.amazonaws.com"},
                "Action": "sts:AssumeRoleWithWebIdentity",
            }
        ],
    }
    add(plan, "aws:iam/role:Role", "app-users", {"assumeRolePolicy": json.dumps(trust)})


def private_api_open_to_every_vpc(plan: Plan) -> None:
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "execute-api:Invoke", "Resource": "*"}],
    }
    inputs = {"name": "internal", "endpointConfiguration": {"types": "PRIVATE"}, "policy": json.dumps(policy)}
    add(plan, "aws:apigateway/restApi:RestApi", "internal-api", inputs)


def internet_facing_load_balancer(plan: Plan) -> None:
    inputs = {"name": "llm-batch-ui", "loadBalancerType": "application", "internal": False, "subnets": ["subnet-1"]}
    add(plan, "aws:lb/loadBalancer:LoadBalancer", "ui-lb", inputs)


def unencrypted_volume(plan: Plan) -> None:
    add(plan, "aws:ebs/volume:Volume", "scratch", {"availabilityZone": f"{REGION}a", "size": 500})


HALVES = ["0.0.0.0/1", "128.0.0.0/1"]


def internet_in_as_two_halves(plan: Plan) -> None:
    group = _named(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")
    group["inputs"]["ingress"] = [
        {"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": [cidr]} for cidr in HALVES
    ]


def internet_in_as_two_rule_resources(plan: Plan) -> None:
    group = _named(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")
    for index, cidr in enumerate(HALVES):
        inputs = {"securityGroupId": group["id"], "ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": cidr}
        add(plan, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", f"ssh-{index}", inputs)


MUTATIONS = [
    Mutation("small", bucket_readable_by_any_accounts_roles, "resource-principals", "storage-tls-only"),
    Mutation("small", role_assumable_by_any_organisation, "trust", "cost-report-role"),
    Mutation("medium", key_decrypt_for_any_organisation, "resource-principals", "kms-key"),
    Mutation("large", interruption_queue_open_to_any_accounts_rules, "service-principals", "karpenter-interruptions"),
    Mutation("small", api_lambda_invocable_from_any_api, "lambda-permissions", "batch-api-invoke-from-api"),
    Mutation("large", key_granted_to_another_account, "cross-account", "Grant reader-grant"),
    Mutation("small", bucket_replicated_to_another_account, "cross-account", "backup-replication"),
    Mutation("large", logs_subscribed_to_another_account, "cross-account", "central-logs"),
    Mutation("medium", cognito_trust_without_conditions, "cross-account", "Role app-users"),
    Mutation("medium", private_api_open_to_every_vpc, "resource-principals", "RestApi internal-api"),
    Mutation("large", internet_facing_load_balancer, "security-groups", "LoadBalancer ui-lb"),
    Mutation("small", unencrypted_volume, "launch-templates", "Volume scratch"),
    Mutation("small", internet_in_as_two_halves, "security-groups", "gpu-node-sg"),
    Mutation("small", internet_in_as_two_rule_resources, "security-groups", "gpu-node-sg"),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: f"{m.stack}-{m.mistake.__name__}")
def test_review_mistake_is_caught_by_its_rule(features_on: Callable[[str], Plan], mutation: Mutation) -> None:
    assert_caught(mutation, features_on)


# --- what still narrows ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "narrows"),
    [
        ("aws:principalarn", "arn:aws:iam::*:role/*", False),
        ("aws:principalarn", f"arn:aws:iam::{ACCOUNT}:role/llm-batch-*", True),
        ("aws:principalarn", f"arn:aws:iam::{OTHER}:role/*", False),
        ("aws:principalarn", f"arn:aws:*:*:{ACCOUNT}:*", False),
        ("aws:sourcearn", f"arn:aws:events:{REGION}:*:rule/*", False),
        ("aws:sourcearn", f"arn:aws:events:*:{ACCOUNT}:rule/llm-batch-*", True),
        ("aws:sourcearn", "arn:aws:s3:::llm-batch-data/*", True),
        ("aws:sourcearn", "arn:aws:s3:::llm-batch-*", False),
        ("aws:principalorgid", "o-*", False),
        ("aws:principalorgid", "o-a1b2c3d4e5", True),
        ("aws:principalorgpaths", "o-a1b2c3d4e5/r-ab12/ou-ab12-11111111/*", True),
        ("aws:principalorgpaths", "o-*/*", False),
        ("aws:sourceaccount", "1234567890*", False),
        ("aws:sourceaccount", ACCOUNT, True),
    ],
)
def test_a_wildcard_narrows_only_when_the_rest_pins_this_account(key: str, value: str, narrows: bool) -> None:
    assert checks_iam.pins_value(key, value, lambda: ACCOUNT) is narrows


def test_an_allowlisted_account_may_be_granted(features_on: Callable[[str], Plan], monkeypatch: Any) -> None:
    """The allowlist is the way through, entry by entry: the grant passes once its account is listed."""
    plan = copy.deepcopy(features_on("large"))
    key_granted_to_another_account(plan)
    monkeypatch.setitem(checks_cross_account.CROSS_ACCOUNT_ALLOWLIST, OTHER, "the audit account reads the key")
    assert checks_cross_account.check_cross_account(plan) == []


def test_the_shipped_allowlist_is_empty_and_every_entry_has_a_reason() -> None:
    assert checks_cross_account.CROSS_ACCOUNT_ALLOWLIST == {}
    assert all(reason.strip() for reason in checks_cross_account.CROSS_ACCOUNT_ALLOWLIST.values())


# --- the mocked cluster's CA --------------------------------------------------------------------------------


@pytest.mark.parametrize("length", range(1, 21))
def test_no_stack_name_makes_the_mocked_ca_look_like_a_secret(length: int) -> None:
    """`prod-east` (9 characters) once gave a 40-character base64 CA that `secret-values` took for an AWS secret
    key: the mocked CA is now a PEM certificate's size and shape, for every stack name of 1 to 20 characters."""
    from infra.naming import prefix
    from infra.ops.plan_mocks import kubeconfig
    from infra.rules.secret_scan import shape_findings

    stack = "prod-east-west-north1"[:length]
    config = kubeconfig(prefix(stack), REGION)
    assert shape_findings(config, "kubeconfig") == []
    assert shape_findings(json.dumps(config), "kubeconfigJson") == []


def test_a_private_rest_api_is_not_taken_for_a_public_one(features_on: Callable[[str], Plan]) -> None:
    """pulumi_aws 7 spells `types` as one string: "PRIVATE" read as a list of letters made it public, which hid
    the real finding (its policy open to every VPC) behind the wrong one."""
    plan = copy.deepcopy(features_on("medium"))
    private_api_open_to_every_vpc(plan)
    assert registry.RULES["public-endpoints"].check(plan) == []
