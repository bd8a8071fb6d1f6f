"""Plan-wide policy checks over every stack, and proof that each check catches what it is for.

The negative tests take the small stack's real plan and break one thing in a copy, so each check is shown
to fail on exactly the mistake it guards against, and to fail when it matches nothing at all.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.rules import checks_order, registry
from infra.rules.registry import CHECKS, NothingMatched
from tests.infra.conftest import STACKS

Plan = list[dict[str, Any]]


def _params() -> list[Any]:
    return [pytest.param(stack, check, id=f"{stack}-{check}") for stack in STACKS for check in CHECKS]


@pytest.mark.parametrize(("stack", "check"), _params())
def test_stack_passes_check(plan_for: Callable[[str], Plan], stack: str, check: str) -> None:
    if stack not in registry.RULES[check].tiers:
        pytest.skip(f"{check} applies to tiers {sorted(registry.RULES[check].tiers)}")
    violations = CHECKS[check](plan_for(stack))
    assert violations == [], "\n".join(str(violation) for violation in violations)


@pytest.fixture
def small(plan_for: Callable[[str], Plan]) -> Plan:
    """A private copy of the small stack's plan, free to break."""
    return copy.deepcopy(plan_for("small"))


def _one(plan: Plan, type_token: str, name: str | None = None) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and (name is None or item["name"] == name)]
    assert found, f"no {type_token} {name or ''} in the plan"
    return found[0]


def _problems(check: str, plan: Plan) -> str:
    return "\n".join(str(violation) for violation in CHECKS[check](plan))


@pytest.mark.parametrize("check", list(CHECKS))
def test_every_check_fails_on_an_empty_plan(check: str) -> None:
    with pytest.raises(NothingMatched, match="nothing was checked"):
        CHECKS[check]([])


def test_every_check_fails_when_its_resources_are_gone(small: Plan) -> None:
    # Components only: what remains when every resource type a check knows is renamed away.
    components = [item for item in small if not item["custom"]]
    for name, check in CHECKS.items():
        if name in checks_order.CHECKS or registry.RULES[name].tiers != {"small", "medium", "large"}:
            continue  # they apply to the EKS tiers only: tests/infra/test_checks_order.py
        with pytest.raises(NothingMatched):
            check(components)


def test_cost_tags_catch_a_provider_without_default_tags(small: Plan) -> None:
    provider = _one(small, "pulumi:providers:aws", "providers-aws")
    provider["inputs"]["defaultTags"] = json.dumps({"tags": {"Project": "llm-batch"}})
    problems = _problems("cost-tags", small)
    assert "aws:s3/bucket:Bucket storage-bucket: no CostCenter tag" in problems
    assert "aws:kms/key:Key kms-key: no CostCenter tag" in problems


def test_cost_tags_catch_a_resource_on_the_default_provider(small: Plan) -> None:
    _one(small, "aws:sns/topic:Topic")["provider"] = None
    assert "aws:sns/topic:Topic alerts-topic: no CostCenter tag" in _problems("cost-tags", small)


def test_cost_tags_accept_a_resource_s_own_tag(small: Plan) -> None:
    topic = _one(small, "aws:sns/topic:Topic")
    topic["provider"] = None
    topic["inputs"]["tags"] = {"CostCenter": "ml-platform"}
    assert _problems("cost-tags", small) == ""


def test_cost_tags_catch_an_untagged_group_and_launches(small: Plan) -> None:
    group = _one(small, "aws:autoscaling/group:Group")
    group["inputs"]["tags"] = [tag for tag in group["inputs"]["tags"] if tag["key"] != "CostCenter"]
    template = _one(small, "aws:ec2/launchTemplate:LaunchTemplate")
    template["inputs"]["tagSpecifications"] = [
        spec for spec in template["inputs"]["tagSpecifications"] if spec["resourceType"] != "volume"
    ]
    problems = _problems("cost-tags", small)
    assert "gpu-node-group: no CostCenter tag propagated at launch" in problems
    assert "gpu-node-template: launched volumes get no CostCenter tag" in problems


def test_buckets_catch_sse_s3(small: Plan) -> None:
    encryption = _one(small, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    encryption["inputs"]["rules"][0]["applyServerSideEncryptionByDefault"] = {"sseAlgorithm": "AES256"}
    assert "storage-bucket: not SSE-KMS" in _problems("buckets", small)


def test_buckets_catch_a_missing_bucket_key(small: Plan) -> None:
    encryption = _one(small, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    encryption["inputs"]["rules"][0]["bucketKeyEnabled"] = False
    assert "storage-bucket: not SSE-KMS with a customer key and the bucket key on" in _problems("buckets", small)


def test_buckets_catch_a_partial_public_access_block(small: Plan) -> None:
    _one(small, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")["inputs"]["restrictPublicBuckets"] = False
    assert "public access not fully blocked" in _problems("buckets", small)


def test_buckets_catch_a_policy_without_tls_rule(small: Plan) -> None:
    bucket_policy = _one(small, "aws:s3/bucketPolicy:BucketPolicy")
    document = json.loads(bucket_policy["inputs"]["policy"])
    document["Statement"] = [s for s in document["Statement"] if s["Sid"] != "DenyInsecureTransport"]
    bucket_policy["inputs"]["policy"] = json.dumps(document)
    assert "no bucket policy denying requests without TLS" in _problems("buckets", small)


def test_buckets_catch_a_second_bare_bucket(small: Plan) -> None:
    bare = copy.deepcopy(_one(small, "aws:s3/bucket:Bucket"))
    bare.update(name="bare", id="bare-bucket", urn=bare["urn"] + "-bare", outputs={"arn": "arn:aws:s3:::bare-bucket"})
    small.append(bare)
    problems = _problems("buckets", small)
    assert problems.count("aws:s3/bucket:Bucket bare:") == 3
    assert "storage-bucket" not in problems


def _add_statement(plan: Plan, statement: dict[str, Any]) -> None:
    job_policy = _one(plan, "aws:iam/policy:Policy")
    document = json.loads(job_policy["inputs"]["policy"])
    document["Statement"].append(statement)
    job_policy["inputs"]["policy"] = json.dumps(document)


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        (
            {"Effect": "Allow", "Action": "*", "Resource": "arn:aws:s3:::x"},
            "action '*' grants a whole service",
        ),
        ({"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::x"}, "action 's3:*' grants a whole"),
        ({"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::x"}, "wildcard action 's3:Get*'"),
        (
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"},
            "Resource \"*\" for ['s3:GetObject']",
        ),
        ({"Effect": "Allow", "NotAction": "iam:*", "Resource": "arn:aws:s3:::x"}, "NotAction/NotResource"),
    ],
)
def test_iam_catches_a_broad_statement(small: Plan, statement: dict[str, Any], problem: str) -> None:
    _add_statement(small, statement)
    problems = _problems("iam", small)
    assert problem in problems
    assert problems.count("\n") == 0  # only the statement added


def test_iam_allows_listed_resource_star_actions_and_any_deny(small: Plan) -> None:
    _add_statement(small, {"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"})
    _add_statement(small, {"Effect": "Deny", "Action": "*", "Resource": "*"})
    assert _problems("iam", small) == ""


def test_iam_catches_an_unlisted_managed_policy(small: Plan) -> None:
    _one(small, "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "gpu-node-job")["inputs"]["policyArn"] = (
        "arn:aws:iam::aws:policy/AdministratorAccess"
    )
    assert "AWS-managed policy AdministratorAccess is not allowlisted" in _problems("iam", small)


def test_iam_catches_a_public_resource_policy(small: Plan) -> None:
    topic_policy = _one(small, "aws:sns/topicPolicy:TopicPolicy")
    document = json.loads(topic_policy["inputs"]["policy"])
    document["Statement"].append({"Effect": "Allow", "Principal": "*", "Action": "sns:Publish", "Resource": "x"})
    topic_policy["inputs"]["policy"] = json.dumps(document)
    assert "Allow to every principal without a condition" in _problems("iam", small)


def test_iam_key_policy_resource_star_is_the_key_itself(small: Plan) -> None:
    key = _one(small, "aws:kms/key:Key")
    statements = json.loads(key["inputs"]["policy"])["Statement"]
    assert {statement["Resource"] for statement in statements} == {"*"}
    assert _problems("iam", small) == ""
    key["type"] = "aws:iam/policy:Policy"  # the same document anywhere else is too broad
    assert 'Resource "*" for' in _problems("iam", small)


def test_launch_templates_catch_imdsv1_unencrypted_and_ssh(small: Plan) -> None:
    template = _one(small, "aws:ec2/launchTemplate:LaunchTemplate")
    template["inputs"]["metadataOptions"]["httpTokens"] = "optional"
    template["inputs"]["blockDeviceMappings"][0]["ebs"]["encrypted"] = "false"
    template["inputs"]["keyName"] = "ops"
    problems = _problems("launch-templates", small)
    assert "IMDSv2 not required" in problems
    assert "volume /dev/xvda not encrypted" in problems
    assert "an SSH key pair is set" in problems


def test_launch_templates_catch_a_template_without_volumes(small: Plan) -> None:
    _one(small, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"].pop("blockDeviceMappings")
    assert "no block device mappings" in _problems("launch-templates", small)


def test_launch_templates_check_karpenter_node_classes() -> None:
    node_class = {
        "type": "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass",
        "name": "gpu",
        "custom": True,
        "inputs": {"spec": {"metadataOptions": {"httpTokens": "optional"}, "blockDeviceMappings": []}},
    }
    problems = _problems("launch-templates", [node_class])
    assert "IMDSv2 not required (spec.metadataOptions)" in problems
    assert "no block device mappings" in problems


def test_security_groups_catch_internet_ingress(small: Plan) -> None:
    group = _one(small, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")
    group["inputs"]["ingress"] = [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]
    small.append(
        {
            "type": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            "name": "open-v6",
            "custom": True,
            "inputs": {"cidrIpv6": "::/0", "ipProtocol": "-1"},
        }
    )
    problems = _problems("security-groups", small)
    assert "gpu-node-sg: ingress from ['0.0.0.0/0']" in problems
    assert "open-v6: ingress rule from the internet" in problems


def test_security_groups_allow_egress_to_the_internet(small: Plan) -> None:
    group = _one(small, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")
    assert group["inputs"]["egress"][0]["cidrBlocks"] == ["0.0.0.0/0"]
    assert group["inputs"]["ingress"] == []
    assert _problems("security-groups", small) == ""


def test_run_checks_lists_every_violation(small: Plan) -> None:
    _one(small, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]["metadataOptions"]["httpTokens"] = "optional"
    _one(small, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")["inputs"]["blockPublicAcls"] = False
    assert {violation.check for violation in registry.run_checks(small)} == {"launch-templates", "buckets"}


def test_is_taggable_reads_the_provider_schema() -> None:
    assert registry.is_taggable("aws:s3/bucket:Bucket")
    assert not registry.is_taggable("aws:s3/bucketPolicy:BucketPolicy")
    assert not registry.is_taggable("kubernetes:core/v1:Namespace")


def test_cost_tags_check_karpenter_node_classes() -> None:
    def node_class(tags: dict[str, str]) -> dict[str, Any]:
        return {
            "type": "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass",
            "name": "gpu",
            "custom": True,
            "inputs": {"spec": {"tags": tags}},
        }

    assert "gpu: launched nodes get no CostCenter tag" in _problems("cost-tags", [node_class({"Team": "ml"})])
    assert _problems("cost-tags", [node_class({"CostCenter": "ml-platform"})]) == ""
