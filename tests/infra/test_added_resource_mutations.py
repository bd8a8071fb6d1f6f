"""Mutation suite, second half: each mistake arrives as a NEW resource of its type, added to a real plan on every
tier where the type can appear (AWS types on every tier, Kubernetes objects on the tiers with a cluster).

A rule that judges only the resources the program makes today (by name, or "the one topic") passes all of these; the
rules judge by meaning over every resource of the type, whoever adds it. Each mistake is applied to a copy of the
session's captured plan with every opt-in feature on (`features_on`), then the named rule must report the added
resource and the gate (`registry.gate`, what `infra.plan` runs) must refuse the plan.
`test_every_type_is_added_on_every_tier` keeps the list honest: every type a rule reads has a mutation that adds
one. The AWS credential values are AWS's own documentation examples; the Hugging Face token and the PEM key are made
up.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from infra.rules import checks_credentials, checks_egress, checks_stores, registry
from infra.rules.k8s_manifests import night_objects
from infra.rules.plan_view import CLUSTER_TIERS
from tests.infra import engine_view
from tests.infra.conftest import TIER_STACKS as STACKS
from tests.infra.mutation_check import Mutation, assert_caught
from tests.infra.plan_select import stack_key

Plan = list[dict[str, Any]]
ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HUB_TOKEN = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----"
ALL_OPEN = {"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]}


def _stack(plan: Plan) -> dict[str, Any]:
    return next(item for item in plan if item["type"] == "pulumi:pulumi:Stack")


def add(plan: Plan, type_token: str, name: str, inputs: dict[str, Any], **outputs: Any) -> dict[str, Any]:
    """Append a resource as a newcomer would declare it: at the program's top level, on the default provider."""
    stack = _stack(plan)
    if type_token.startswith("kubernetes:"):
        provider = next(item["urn"] for item in plan if item["type"] == "pulumi:providers:kubernetes")
    else:
        provider = stack_key(plan)["provider"]
    prefix = "::".join(stack["urn"].split("::")[:2])
    item = {
        "type": type_token,
        "name": name,
        "urn": f"{prefix}::{type_token}::{name}",
        "parent": stack["urn"],
        "custom": True,
        "provider": provider,
        "inputs": inputs,
        "id": outputs.pop("id", name),
        "outputs": outputs,
        "dependencies": [stack["urn"]],
    }
    plan.append(item)
    return item


def _vpc(plan: Plan) -> str:
    return str(next(item["id"] for item in plan if item["type"] == "aws:ec2/vpc:Vpc"))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- data stores off the stack key --------------------------------------------------------------------------


def topic_without_key(plan: Plan) -> None:
    add(plan, checks_stores.TOPIC, "events-topic", {"name": "llm-batch-events"})


def topic_on_aws_managed_key(plan: Plan) -> None:
    add(plan, checks_stores.TOPIC, "events-topic", {"name": "llm-batch-events", "kmsMasterKeyId": "alias/aws/sns"})


def log_group_without_key(plan: Plan) -> None:
    add(plan, checks_stores.LOG_GROUP, "debug-logs", {"name": "/llm-batch/debug", "retentionInDays": 7})


def secret_on_default_key(plan: Plan) -> None:
    add(plan, checks_stores.SECRET, "api-key", {"name": "llm-batch/api-key"})


def secret_on_a_foreign_key(plan: Plan) -> None:
    foreign = "arn:aws:kms:us-east-1:999999999999:key/11111111-2222-3333-4444-555555555555"
    add(plan, checks_stores.SECRET, "api-key", {"name": "llm-batch/api-key", "kmsKeyId": foreign})


def queue_on_sqs_managed_encryption(plan: Plan) -> None:
    arn = "arn:aws:sqs:us-east-1:123456789012:llm-batch-work"
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/llm-batch-work"
    add(
        plan,
        checks_stores.QUEUE,
        "work-queue",
        {"name": "llm-batch-work", "sqsManagedSseEnabled": True},
        arn=arn,
        id=url,
    )


def table_on_aws_owned_key(plan: Plan) -> None:
    inputs = {"name": "llm-batch-leases", "hashKey": "id", "attributes": [{"name": "id", "type": "S"}]}
    add(plan, checks_stores.TABLE, "leases", {**inputs, "billingMode": "PAY_PER_REQUEST"})


def repository_on_another_accounts_key(plan: Plan) -> None:
    foreign = "arn:aws:kms:us-east-1:999999999999:key/11111111-2222-3333-4444-555555555555"
    inputs = {"name": "llm-batch/tools", "encryptionConfigurations": [{"encryptionType": "KMS", "kmsKey": foreign}]}
    add(plan, checks_stores.REPOSITORY, "tools-repository", inputs)


def scratch_bucket_on_sse_s3(plan: Plan) -> None:
    rules = [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]
    add(plan, checks_stores.BUCKET_ENCRYPTION, "scratch-encryption", {"bucket": "llm-batch-scratch", "rules": rules})


def table_via_aws_native(plan: Plan) -> None:
    add(plan, "aws-native:dynamodb:Table", "leases", {"tableName": "llm-batch-leases"})


# --- long-lived credentials ----------------------------------------------------------------------------------


def _adds(type_token: str, inputs: dict[str, Any]) -> Callable[[Plan], None]:
    def mistake(plan: Plan) -> None:
        add(plan, type_token, "ci-deployer", inputs)

    mistake.__name__ = f"adds_{type_token.rsplit(':', 1)[-1]}_{type_token.split(':')[0].replace('-', '_')}"
    return mistake


def user_with_access_key(plan: Plan) -> None:
    add(plan, "aws:iam/user:User", "ci-deployer", {"name": "ci-deployer"})
    add(plan, "aws:iam/accessKey:AccessKey", "ci-deployer-key", {"user": "ci-deployer"})


USER_INPUTS: dict[str, dict[str, Any]] = {
    "aws:iam/user:User": {"name": "ci-deployer"},
    "aws:iam/accessKey:AccessKey": {"user": "ci-deployer"},
    "aws:iam/userLoginProfile:UserLoginProfile": {"user": "ci-deployer", "passwordLength": 20},
    "aws:iam/serviceSpecificCredential:ServiceSpecificCredential": {
        "serviceName": "codecommit.amazonaws.com",
        "userName": "ci-deployer",
    },
    "aws:iam/signingCertificate:SigningCertificate": {"userName": "ci-deployer", "certificateBody": "-----BEGIN"},
    "aws:iam/sshKey:SshKey": {"username": "ci-deployer", "encoding": "SSH", "publicKey": "ssh-ed25519 AAAA"},
    "aws-native:iam:User": {"userName": "ci-deployer"},
    "aws-native:iam:AccessKey": {"userName": "ci-deployer"},
    "aws:iam/userPolicyAttachment:UserPolicyAttachment": {
        "user": "ci-deployer",
        "policyArn": "arn:aws:iam::aws:policy/ReadOnlyAccess",
    },
}


# --- wide egress ----------------------------------------------------------------------------------------------


def group_with_all_egress(plan: Plan) -> None:
    add(plan, "aws:ec2/securityGroup:SecurityGroup", "debug-sg", {"vpcId": _vpc(plan), "egress": [ALL_OPEN]})


def default_group_with_all_egress(plan: Plan) -> None:
    # AWS's own default rule, put back on the VPC's default group.
    add(
        plan,
        "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup",
        "default-sg",
        {"vpcId": _vpc(plan), "egress": [ALL_OPEN]},
    )


def legacy_egress_rule_to_the_internet(plan: Plan) -> None:
    inputs = {"type": "egress", "securityGroupId": "sg-0123", **ALL_OPEN}
    add(plan, checks_egress.LEGACY_RULE, "all-out", inputs)


def egress_rule_to_the_internet(plan: Plan) -> None:
    inputs = {"securityGroupId": "sg-0123", "ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0"}
    add(plan, checks_egress.EGRESS_RULE, "all-out", inputs)


def egress_rule_http_to_the_internet(plan: Plan) -> None:
    inputs = {"securityGroupId": "sg-0123", "ipProtocol": "tcp", "fromPort": 80, "toPort": 80, "cidrIpv6": "::/0"}
    add(plan, checks_egress.EGRESS_RULE, "http-out", inputs)


# --- secret-shaped values ---------------------------------------------------------------------------------------


def lambda_with_aws_keys_and_hub_token(plan: Plan) -> None:
    variables = {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "HF": HUB_TOKEN}
    inputs = {"runtime": "python3.12", "handler": "app.handler", "environment": {"variables": variables}}
    add(plan, checks_credentials.LAMBDA, "helper", inputs)


def lambda_with_a_pulumi_secret(plan: Plan) -> None:
    # pulumi.Output.secret(...) in an environment variable: masked in the plan, in clear in the function.
    inputs = {"runtime": "python3.12", "environment": {"variables": {"DATABASE_URL": "[secret]"}}}
    add(plan, checks_credentials.LAMBDA, "helper", inputs)


def state_machine_with_a_password(plan: Plan) -> None:
    definition = {
        "StartAt": "Login",
        "States": {"Login": {"Type": "Pass", "Parameters": {"user": "ml", "Password": "correct-horse"}, "End": True}},
    }
    add(plan, checks_credentials.STATE_MACHINE, "login", {"definition": json.dumps(definition)})


def launch_template_with_a_hub_token(plan: Plan) -> None:
    user_data = f"#!/bin/bash\nexport HUGGING_FACE_HUB_TOKEN={HUB_TOKEN}\ndocker run job\n"
    add(plan, checks_credentials.LAUNCH_TEMPLATE, "debug-lt", {"userData": _b64(user_data)})


def launch_template_with_a_private_key(plan: Plan) -> None:
    user_data = f"#!/bin/bash\ncat > /root/.ssh/id_rsa <<'EOF'\n{PEM}\nEOF\n"
    add(plan, checks_credentials.LAUNCH_TEMPLATE, "debug-lt", {"userData": _b64(user_data)})


def instance_with_a_password_in_user_data(plan: Plan) -> None:
    add(plan, checks_credentials.INSTANCE, "debug", {"userData": "#!/bin/bash\nDB_PASSWORD='s3cr3t!' ./start\n"})


def task_definition_with_a_hub_token(plan: Plan) -> None:
    containers = [{"name": "job", "image": "x", "environment": [{"name": "HF_TOKEN", "value": HUB_TOKEN}]}]
    add(
        plan, checks_credentials.ECS_TASK, "job-task", {"family": "job", "containerDefinitions": json.dumps(containers)}
    )


def _container(env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "app", "image": "busybox@sha256:" + "0" * 64, "env": env}


def deployment_with_a_hub_token(plan: Plan) -> None:
    template = {
        "metadata": {"labels": {"app": "ui"}},
        "spec": {"containers": [_container([{"name": "HF_TOKEN", "value": HUB_TOKEN}])]},
    }
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "ui", "namespace": "llm-batch"},
        "spec": {"selector": {"matchLabels": {"app": "ui"}}, "template": template},
    }
    add(plan, "kubernetes:apps/v1:Deployment", "ui", manifest)


def pod_with_a_password(plan: Plan) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "debug", "namespace": "llm-batch"},
        "spec": {"containers": [_container([{"name": "REDIS_PASSWORD", "value": "hunter2"}])]},
    }
    add(plan, "kubernetes:core/v1:Pod", "debug", manifest)


def _night_rayjob(plan: Plan) -> dict[str, Any]:
    return copy.deepcopy(next(item for item in night_objects(plan) if item["kind"] == "RayJob"))


def rayjob_with_aws_keys_on_the_head(plan: Plan) -> None:
    manifest = _night_rayjob(plan)
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"].append({"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET_ACCESS_KEY})
    add(plan, "kubernetes:ray.io/v1:RayJob", "adhoc", manifest)


def rayservice_with_a_token_on_the_workers(plan: Plan) -> None:
    cluster = _night_rayjob(plan)["spec"]["rayClusterSpec"]
    cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "serveApiToken", "value": "let-me-in-please"}
    )
    manifest = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "endpoint", "namespace": "llm-batch"},
        "spec": {"rayClusterConfig": cluster},
    }
    add(plan, "kubernetes:ray.io/v1:RayService", "endpoint", manifest)


def config_map_with_aws_credentials_file(plan: Plan) -> None:
    credentials = f"[default]\naws_access_key_id = {ACCESS_KEY_ID}\naws_secret_access_key = {SECRET_ACCESS_KEY}\n"
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "aws", "namespace": "llm-batch"},
        "data": {"credentials": credentials},
    }
    add(plan, "kubernetes:core/v1:ConfigMap", "aws", manifest)


def config_map_with_a_token_in_its_config_file(plan: Plan) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hub", "namespace": "llm-batch"},
        "data": {"hub.yaml": "hub:\n  endpoint: https://huggingface.co\n  api_token: not-a-reference\n"},
    }
    add(plan, "kubernetes:core/v1:ConfigMap", "hub", manifest)


@dataclass(frozen=True)
class Added:
    type_token: str  # the type of the resource the mistake adds
    mistake: Callable[[Plan], None]
    rule: str
    resource: str  # what the violation's resource label must contain


ADDED = [
    Added(checks_stores.TOPIC, topic_without_key, "store-keys", "Topic events-topic"),
    Added(checks_stores.TOPIC, topic_on_aws_managed_key, "store-keys", "Topic events-topic"),
    Added(checks_stores.LOG_GROUP, log_group_without_key, "store-keys", "LogGroup debug-logs"),
    Added(checks_stores.SECRET, secret_on_default_key, "store-keys", "Secret api-key"),
    Added(checks_stores.SECRET, secret_on_a_foreign_key, "store-keys", "Secret api-key"),
    Added(checks_stores.QUEUE, queue_on_sqs_managed_encryption, "store-keys", "Queue work-queue"),
    Added(checks_stores.TABLE, table_on_aws_owned_key, "store-keys", "Table leases"),
    Added(checks_stores.REPOSITORY, repository_on_another_accounts_key, "store-keys", "Repository tools-repository"),
    Added(checks_stores.BUCKET_ENCRYPTION, scratch_bucket_on_sse_s3, "store-keys", "scratch-encryption"),
    Added("aws-native:dynamodb:Table", table_via_aws_native, "store-keys", "aws-native:dynamodb:Table leases"),
    Added("aws:iam/user:User", user_with_access_key, "iam-users", "AccessKey ci-deployer-key"),
    *[Added(token, _adds(token, inputs), "iam-users", f"{token} ci-deployer") for token, inputs in USER_INPUTS.items()],
    Added("aws:ec2/securityGroup:SecurityGroup", group_with_all_egress, "sg-egress", "SecurityGroup debug-sg"),
    Added(checks_egress.GROUP_TYPES[1], default_group_with_all_egress, "sg-egress", "DefaultSecurityGroup default-sg"),
    Added(checks_egress.LEGACY_RULE, legacy_egress_rule_to_the_internet, "sg-egress", "SecurityGroupRule all-out"),
    Added(checks_egress.EGRESS_RULE, egress_rule_to_the_internet, "sg-egress", "EgressRule all-out"),
    Added(checks_egress.EGRESS_RULE, egress_rule_http_to_the_internet, "sg-egress", "EgressRule http-out"),
    Added(checks_credentials.LAMBDA, lambda_with_aws_keys_and_hub_token, "secret-values", "Function helper"),
    Added(checks_credentials.LAMBDA, lambda_with_a_pulumi_secret, "secret-values", "Function helper"),
    Added(checks_credentials.STATE_MACHINE, state_machine_with_a_password, "secret-values", "StateMachine login"),
    Added(checks_credentials.LAUNCH_TEMPLATE, launch_template_with_a_hub_token, "secret-values", "debug-lt"),
    Added(checks_credentials.LAUNCH_TEMPLATE, launch_template_with_a_private_key, "secret-values", "debug-lt"),
    Added(checks_credentials.INSTANCE, instance_with_a_password_in_user_data, "secret-values", "Instance debug"),
    Added(checks_credentials.ECS_TASK, task_definition_with_a_hub_token, "secret-values", "job-task"),
    Added("kubernetes:apps/v1:Deployment", deployment_with_a_hub_token, "secret-values", "Deployment ui"),
    Added("kubernetes:core/v1:Pod", pod_with_a_password, "secret-values", "Pod debug"),
    Added("kubernetes:ray.io/v1:RayJob", rayjob_with_aws_keys_on_the_head, "secret-values", "RayJob adhoc"),
    Added("kubernetes:ray.io/v1:RayService", rayservice_with_a_token_on_the_workers, "secret-values", "RayService"),
    Added("kubernetes:core/v1:ConfigMap", config_map_with_aws_credentials_file, "secret-values", "ConfigMap aws"),
    Added("kubernetes:core/v1:ConfigMap", config_map_with_a_token_in_its_config_file, "secret-values", "ConfigMap hub"),
]
# Where each rule looks, by type: every one must be added, as a mistake, on every tier where it can appear.
READ_TYPES: dict[str, tuple[str, ...]] = {
    "store-keys": tuple(checks_stores.KEY_INPUTS),
    "iam-users": tuple(checks_credentials.USER_TYPES),
    "sg-egress": checks_egress.EGRESS_TYPES,
    "secret-values": (
        *checks_credentials.LOCATION_TYPES,
        # Pod templates and ConfigMaps are read in any Kubernetes object; these are the kinds the project runs.
        "kubernetes:apps/v1:Deployment",
        "kubernetes:core/v1:Pod",
        "kubernetes:ray.io/v1:RayJob",
        "kubernetes:ray.io/v1:RayService",
        "kubernetes:core/v1:ConfigMap",
    ),
}


def tiers_of(type_token: str) -> list[str]:
    """The tiers where a resource of the type can appear: Kubernetes objects need a cluster."""
    return [stack for stack in STACKS if not type_token.startswith("kubernetes:") or stack in CLUSTER_TIERS]


def _params() -> list[Any]:
    return [
        pytest.param(stack, added, id=f"{stack}-{added.mistake.__name__}")
        for added in ADDED
        for stack in tiers_of(added.type_token)
    ]


@pytest.mark.parametrize(("stack", "added"), _params())
def test_added_mistake_is_caught_by_its_rule(features_on: Callable[[str], Plan], stack: str, added: Added) -> None:
    plan = copy.deepcopy(features_on(stack))
    assert registry.RULES[added.rule].check(plan) == [], "the real plan must pass the rule before the mistake"
    before = len(plan)
    added.mistake(plan)
    assert any(item["type"] == added.type_token for item in plan[before:]), "the mistake adds a resource of its type"
    violations = registry.RULES[added.rule].check(plan)
    assert any(added.resource in violation.resource for violation in violations), violations
    # The pack's `validate`, called directly, reports the same (tests/infra/test_policy_pack.py drives its server).
    assert engine_view.pack_reports(added.rule, plan, stack, features_on(stack)) == engine_view.gate_reports(
        added.rule, violations
    )
    with pytest.raises(registry.PolicyError, match=f"(?s){added.rule}.*fix: "):
        registry.gate(plan)


def test_every_type_is_added_on_every_tier() -> None:
    added = {(item.rule, item.type_token) for item in ADDED}
    missing = [(rule, token) for rule, tokens in READ_TYPES.items() for token in tokens if (rule, token) not in added]
    assert missing == []


def test_the_security_doc_maps_every_rule_to_its_mutations() -> None:
    """docs/security.md's principle -> rule -> mutations table has a row for every rule a mutation trips."""
    from infra.ops.stacks import ROOT
    from tests.infra.test_review_mutations import MUTATIONS as REVIEW_MUTATIONS
    from tests.infra.test_security_mutations import MUTATIONS

    text = (ROOT / "docs" / "security.md").read_text()
    table = text.split("## Principle -> rule -> mutations", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ") and "`" in line]
    documented = {name for row in rows for name in re.findall(r"`([a-z0-9-]+)`", row[2])}
    tripped = {mutation.rule for mutation in [*MUTATIONS, *ADDED, *EDITS, *REVIEW_MUTATIONS]}
    assert tripped - documented == set()


def test_kubernetes_objects_appear_only_where_there_is_a_cluster(plan_for: Callable[[str], Plan]) -> None:
    """`tiers_of` is right about the plans: a Kubernetes provider exactly on the cluster tiers."""
    with_cluster = {
        stack for stack in STACKS if any(item["type"] == "pulumi:providers:kubernetes" for item in plan_for(stack))
    }
    assert with_cluster == set(STACKS) & CLUSTER_TIERS


# --- the same mistakes as edits of what the program already has ------------------------------------------------


def _named(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and item["name"] == name]
    assert len(found) == 1, f"expected one {type_token} {name}"
    return found[0]


def hub_token_secret_loses_its_key(plan: Plan) -> None:
    _named(plan, checks_stores.SECRET, "secrets-hub-token")["inputs"].pop("kmsKeyId")


def alerts_topic_on_the_billing_regions_key(plan: Plan) -> None:
    billing_key = _named(plan, checks_stores.KEY, "observability-billing-kms-key")
    _named(plan, checks_stores.TOPIC, "alerts-topic")["inputs"]["kmsMasterKeyId"] = billing_key["outputs"]["arn"]


def interruption_queue_takes_application_events(plan: Plan) -> None:
    """Karpenter's queue, on SSE-SQS, also fed the job's own events: no longer a queue of AWS's events only."""
    queue = _named(plan, checks_stores.QUEUE, "karpenter-interruptions")
    pattern = {"source": ["llm-batch.job"], "detail-type": ["Shard committed"]}
    add(plan, checks_stores.RULE, "job-events", {"name": "llm-batch-job-events", "eventPattern": json.dumps(pattern)})
    target = {"rule": "llm-batch-job-events", "arn": queue["outputs"]["arn"]}
    add(plan, checks_stores.TARGET, "job-events-target", target)


def job_role_may_send_to_the_interruption_queue(plan: Plan) -> None:
    queue = _named(plan, checks_stores.QUEUE, "karpenter-interruptions")
    job_policy = _named(plan, "aws:iam/policy:Policy", "job-access-policy")
    document = json.loads(job_policy["inputs"]["policy"])
    document["Statement"].append({"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": queue["outputs"]["arn"]})
    job_policy["inputs"]["policy"] = json.dumps(document)


def cost_report_gets_a_hub_token(plan: Plan) -> None:
    variables = _named(plan, checks_credentials.LAMBDA, "cost-report")["inputs"]["environment"]["variables"]
    variables["HF_TOKEN"] = HUB_TOKEN


def hub_token_pasted_where_its_arn_belongs(plan: Plan) -> None:
    """The night's RayJob, rendered from the `rayjob_args` export, given the token itself instead of its ARN."""
    stack = _stack(plan)
    args = json.loads(stack["outputs"]["rayjob_args"])
    args["hub_token_secret_arn"] = HUB_TOKEN
    stack["outputs"] = {**stack["outputs"], "rayjob_args": json.dumps(args)}


def small_node_user_data_exports_a_key(plan: Plan) -> None:
    template = _named(plan, checks_credentials.LAUNCH_TEMPLATE, "gpu-node-template")
    script = base64.b64decode(template["inputs"]["userData"]).decode()
    script = script.replace("set -euo pipefail\n", f"set -euo pipefail\nexport AWS_ACCESS_KEY_ID={ACCESS_KEY_ID}\n")
    template["inputs"]["userData"] = _b64(script)


def gpu_node_group_egress_opened(plan: Plan) -> None:
    _named(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")["inputs"]["egress"].append(ALL_OPEN)


def submitter_egress_to_any_port(plan: Plan) -> None:
    group = _named(plan, "aws:ec2/securityGroup:SecurityGroup", "eks-submitter")
    group["inputs"]["egress"][0].update(fromPort=0, toPort=65535)


EDITS = [
    Mutation("small", hub_token_secret_loses_its_key, "store-keys", "secrets-hub-token"),
    Mutation("large", alerts_topic_on_the_billing_regions_key, "store-keys", "Topic alerts-topic"),
    Mutation("large", interruption_queue_takes_application_events, "store-keys", "karpenter-interruptions"),
    Mutation("large", job_role_may_send_to_the_interruption_queue, "store-keys", "karpenter-interruptions"),
    Mutation("small", cost_report_gets_a_hub_token, "secret-values", "Function cost-report"),
    Mutation("medium", hub_token_pasted_where_its_arn_belongs, "secret-values", "rayjob_args -> RayJob"),
    Mutation("small", small_node_user_data_exports_a_key, "secret-values", "gpu-node-template"),
    Mutation("small", gpu_node_group_egress_opened, "sg-egress", "gpu-node-sg"),
    Mutation("large", submitter_egress_to_any_port, "sg-egress", "eks-submitter"),
]


@pytest.mark.parametrize("edited", EDITS, ids=lambda m: f"{m.stack}-{m.mistake.__name__}")
def test_edited_mistake_is_caught_by_its_rule(features_on: Callable[[str], Plan], edited: Mutation) -> None:
    assert_caught(edited, features_on)
