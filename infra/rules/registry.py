"""Every policy rule by name (`RULES`), the checks that have no module of their own (cost tags, buckets, IAM,
launch templates, security groups, images), and the gate over a plan (`report`, `gate`, `preview_line`).

The one entry both places that run the rules use: the offline gate (`python -m infra.policy`, whose command is
infra/ops/policy.py, and `python -m infra.plan`, over a plan captured under mocks) and the policy pack
(infra/policy_pack/, over the engine's resources on a real preview or up, read as a plan by `policy_stack`).

Each check returns the violations it found and raises `NothingMatched` when the plan held no resource it
applies to, so a check can never pass by seeing nothing (a renamed type token would otherwise silence it).
Each rule declares the tiers it applies to, the fix its violations call for and what the pack does with a
violation (mandatory or advisory). docs/security.md states the principles and where each rule runs.
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any

from infra.rules import (
    checks_batch_api,
    checks_costs,
    checks_credentials,
    checks_cross_account,
    checks_egress,
    checks_egress_path,
    checks_iam,
    checks_k8s,
    checks_kms,
    checks_network,
    checks_order,
    checks_ray,
    checks_stores,
    iam_allowlist,
)
from infra.rules.plan_view import (
    CLUSTER_TIERS,
    NothingMatched,
    Plan,
    Resource,
    Rule,
    Violation,
    as_json,
    as_list,
    is_node_class,
    label,
    of_type,
    refers_to,
    require_matches,
    tier_of,
)

REQUIRED_TAG = "CostCenter"
OPEN_CIDRS = frozenset({"0.0.0.0/0", "::/0"})
# Instances and volumes launched from a template are tagged by the template, not by provider default tags.
LAUNCHED_KINDS = ("instance", "volume")

# The plan readers every check module shares (infra/rules/plan_view.py), under the names this module's checks use;
# NothingMatched, Plan, Resource and Violation are re-exported from here.
_label = label
_require_matches = require_matches
_of_type = of_type
_json = as_json
_as_list = as_list
_is_node_class = is_node_class


def _truthy(value: Any) -> bool:
    # Launch template EBS flags are strings ("true") in the AWS provider's schema; others are booleans.
    return value is True or (isinstance(value, str) and value.lower() == "true")


# --- cost-allocation tags ---------------------------------------------------------------------------------


@cache
def is_taggable(type_token: str) -> bool:
    """Whether the pulumi_aws resource class of a type token takes `tags` (so default tags reach it)."""
    if not type_token.startswith("aws:"):
        return False
    module_path, _, class_name = type_token.split(":", 1)[1].rpartition(":")
    module = module_path.split("/", 1)[0]
    try:
        package = importlib.import_module("pulumi_aws" if module == "index" else f"pulumi_aws.{module}")
    except ImportError:
        return False
    cls = getattr(package, class_name, None)
    init = getattr(cls, "_internal_init", None)
    return init is not None and "tags" in inspect.signature(init).parameters


def _provider_tags(plan: Plan) -> dict[str, dict[str, str]]:
    tags: dict[str, dict[str, str]] = {}
    for provider in _of_type(plan, "pulumi:providers:aws"):
        default = _json(provider["inputs"].get("defaultTags")) or {}
        tags[provider["urn"]] = dict(default.get("tags") or {}) if isinstance(default, dict) else {}
    return tags


def check_cost_tags(plan: Plan) -> list[Violation]:
    """Every taggable AWS resource carries CostCenter (its provider's default tags or its own), and what an
    Auto Scaling group, launch template or Karpenter EC2NodeClass launches carries it too."""
    name = "cost-tags"
    defaults = _provider_tags(plan)
    violations: list[Violation] = []
    matched = 0
    for item in plan:
        if item.get("custom") and _is_node_class(item["type"]):
            # Karpenter tags what it launches from the EC2NodeClass only; default tags never reach it.
            matched += 1
            if not ((item["inputs"].get("spec") or {}).get("tags") or {}).get(REQUIRED_TAG):
                violations.append(Violation(name, _label(item), f"launched nodes get no {REQUIRED_TAG} tag"))
            continue
        if not item.get("custom") or not is_taggable(item["type"]):
            continue
        matched += 1
        inputs = item["inputs"]
        if item["type"] == "aws:autoscaling/group:Group":
            # The group's tags are a list, and the provider's default tags never reach them.
            found = [tag for tag in _as_list(inputs.get("tags")) if tag.get("key") == REQUIRED_TAG]
            if not found or not found[0].get("value") or not found[0].get("propagateAtLaunch"):
                violations.append(Violation(name, _label(item), f"no {REQUIRED_TAG} tag propagated at launch"))
            continue
        own = inputs.get("tags") or {}
        effective = {**defaults.get(item.get("provider") or "", {}), **(own if isinstance(own, dict) else {})}
        if not effective.get(REQUIRED_TAG):
            violations.append(Violation(name, _label(item), f"no {REQUIRED_TAG} tag (own or provider default)"))
        if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate":
            specs = {
                spec.get("resourceType"): spec.get("tags") or {} for spec in _as_list(inputs.get("tagSpecifications"))
            }
            for kind in LAUNCHED_KINDS:
                if not specs.get(kind, {}).get(REQUIRED_TAG):
                    violations.append(Violation(name, _label(item), f"launched {kind}s get no {REQUIRED_TAG} tag"))
    _require_matches(name, matched, "taggable AWS resource")
    return violations


# --- buckets ----------------------------------------------------------------------------------------------


def _for_bucket(plan: Plan, type_token: str, bucket: Resource) -> list[Resource]:
    return [item for item in _of_type(plan, type_token) if refers_to(item, "bucket", bucket)]


def _denies_insecure_transport(document: Any, bucket_arn: str) -> bool:
    for statement in _as_list(_json(document).get("Statement") if isinstance(_json(document), dict) else None):
        condition = statement.get("Condition", {}).get("Bool", {})
        resources = set(_as_list(statement.get("Resource")))
        if (
            statement.get("Effect") == "Deny"
            and str(condition.get("aws:SecureTransport")).lower() == "false"
            and statement.get("Principal") in ("*", {"AWS": "*"})
            and any(action in ("s3:*", "*") for action in _as_list(statement.get("Action")))
            and {bucket_arn, f"{bucket_arn}/*"} <= resources
        ):
            return True
    return False


def check_buckets(plan: Plan) -> list[Violation]:
    """Every bucket: SSE-KMS with a customer key and bucket key, all four public-access blocks, TLS only."""
    name = "buckets"
    violations: list[Violation] = []
    buckets = _of_type(plan, *checks_network.CHECKED_BUCKET_TYPES)
    for bucket in buckets:
        label = _label(bucket)
        arn = str(bucket.get("outputs", {}).get("arn", ""))
        rules = [
            rule
            for config in _for_bucket(
                plan,
                "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                bucket,
            )
            for rule in _as_list(config["inputs"].get("rules"))
        ]
        if not any(
            (rule.get("applyServerSideEncryptionByDefault") or {}).get("sseAlgorithm") in ("aws:kms", "aws:kms:dsse")
            and (rule.get("applyServerSideEncryptionByDefault") or {}).get("kmsMasterKeyId")
            and rule.get("bucketKeyEnabled") is True
            for rule in rules
        ):
            violations.append(Violation(name, label, "not SSE-KMS with a customer key and the bucket key on"))
        blocks = _for_bucket(plan, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", bucket)
        flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        if not any(all(block["inputs"].get(flag) is True for flag in flags) for block in blocks):
            violations.append(Violation(name, label, "public access not fully blocked (all four flags)"))
        policies = _for_bucket(plan, "aws:s3/bucketPolicy:BucketPolicy", bucket)
        if not any(_denies_insecure_transport(policy["inputs"].get("policy"), arn) for policy in policies):
            violations.append(Violation(name, label, "no bucket policy denying requests without TLS"))
    _require_matches(name, len(buckets), "S3 bucket")
    return violations


# --- IAM --------------------------------------------------------------------------------------------------

_DOCUMENT_INPUTS: dict[str, tuple[str, ...]] = {
    "aws:iam/role:Role": ("assumeRolePolicy",),
    "aws:iam/policy:Policy": ("policy",),
    "aws:iam/rolePolicy:RolePolicy": ("policy",),
    "aws:iam/userPolicy:UserPolicy": ("policy",),
    "aws:iam/groupPolicy:GroupPolicy": ("policy",),
    "aws:s3/bucketPolicy:BucketPolicy": ("policy",),
    "aws:sns/topicPolicy:TopicPolicy": ("policy",),
    "aws:sqs/queuePolicy:QueuePolicy": ("policy",),
    "aws:kms/key:Key": ("policy",),
    "aws:secretsmanager/secretPolicy:SecretPolicy": ("policy",),
    "aws:ecr/repositoryPolicy:RepositoryPolicy": ("policy",),
    "aws:ec2/vpcEndpoint:VpcEndpoint": ("policy",),
}
_ATTACHMENT_INPUTS: dict[str, str] = {
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": "policyArn",
    "aws:iam/policyAttachment:PolicyAttachment": "policyArn",
    "aws:iam/userPolicyAttachment:UserPolicyAttachment": "policyArn",
    "aws:iam/groupPolicyAttachment:GroupPolicyAttachment": "policyArn",
}


def _documents(item: Resource) -> Iterator[Any]:
    for key in _DOCUMENT_INPUTS.get(item["type"], ()):
        if item["inputs"].get(key):
            yield _json(item["inputs"][key])
    if item["type"] == "aws:iam/role:Role":
        for inline in _as_list(item["inputs"].get("inlinePolicies")):
            if inline.get("policy"):
                yield _json(inline["policy"])


def statement_problems(statement: Mapping[str, Any], document_type: str) -> list[str]:
    """What is wrong with one statement under the IAM rules (see infra.rules.iam_allowlist)."""
    if statement.get("Effect") != "Allow":
        return []  # Deny statements only take permissions away
    problems: list[str] = []
    if "NotAction" in statement or "NotResource" in statement:
        problems.append("Allow with NotAction/NotResource grants everything else")
    actions = [str(action) for action in _as_list(statement.get("Action"))]
    for action in actions:
        if document_type in iam_allowlist.WHOLE_SERVICE_DOCUMENTS:
            break  # a perimeter, not a grant: see iam_allowlist
        if action == "*" or action.endswith(":*"):
            problems.append(f"action {action!r} grants a whole service")
        elif "*" in action and action not in iam_allowlist.ACTION_WILDCARDS:
            problems.append(f"wildcard action {action!r} is not in iam_allowlist.ACTION_WILDCARDS")
    if "*" in _as_list(statement.get("Resource")) and document_type not in iam_allowlist.RESOURCE_STAR_DOCUMENTS:
        unlisted = [action for action in actions if action not in iam_allowlist.RESOURCE_STAR_ACTIONS]
        if unlisted:
            problems.append(f'Resource "*" for {unlisted} (not in iam_allowlist.RESOURCE_STAR_ACTIONS)')
    principal = statement.get("Principal")
    if principal in ("*", {"AWS": "*"}) and not statement.get("Condition"):
        problems.append("Allow to every principal without a condition")
    return problems


def check_iam(plan: Plan) -> list[Violation]:
    """Every Allow statement in every IAM, key, bucket and topic policy, and every managed policy attached."""
    name = "iam"
    violations: list[Violation] = []
    matched = 0
    for item in plan:
        if not item.get("custom"):
            continue
        for document in _documents(item):
            if not isinstance(document, dict):
                violations.append(Violation(name, _label(item), "policy document is not JSON"))
                continue
            for statement in _as_list(document.get("Statement")):
                matched += 1
                for problem in statement_problems(statement, item["type"]):
                    sid = statement.get("Sid", "(no Sid)")
                    violations.append(Violation(name, _label(item), f"{sid}: {problem}"))
        arns = [item["inputs"].get(_ATTACHMENT_INPUTS[item["type"]])] if item["type"] in _ATTACHMENT_INPUTS else []
        if item["type"] == "aws:iam/role:Role":
            arns += _as_list(item["inputs"].get("managedPolicyArns"))
        for arn in arns:
            matched += 1
            managed = iam_allowlist.managed_policy_name(str(arn))
            if managed is not None and managed not in iam_allowlist.MANAGED_POLICIES:
                violations.append(Violation(name, _label(item), f"AWS-managed policy {managed} is not allowlisted"))
    _require_matches(name, matched, "IAM statement or policy attachment")
    return violations


# --- compute ----------------------------------------------------------------------------------------------


def _ebs_problems(mappings: Any) -> list[str]:
    devices = _as_list(mappings)
    if not devices:
        return ["no block device mappings: the root volume's encryption is left to the AMI"]
    return [
        f"volume {device.get('deviceName')} not encrypted"
        for device in devices
        if "ebs" in device and not _truthy((device.get("ebs") or {}).get("encrypted"))
    ]


def check_launch_templates(plan: Plan) -> list[Violation]:
    """Every launch template, instance and Karpenter EC2NodeClass: IMDSv2 required and encrypted volumes; every
    EBS volume declared on its own encrypted."""
    name = "launch-templates"
    violations: list[Violation] = []
    matched = 0
    for item in _of_type(plan, "aws:ec2/launchTemplate:LaunchTemplate"):
        matched += 1
        inputs = item["inputs"]
        if (inputs.get("metadataOptions") or {}).get("httpTokens") != "required":
            violations.append(Violation(name, _label(item), "IMDSv2 not required (metadataOptions.httpTokens)"))
        violations += [Violation(name, _label(item), p) for p in _ebs_problems(inputs.get("blockDeviceMappings"))]
        if inputs.get("keyName"):
            violations.append(Violation(name, _label(item), "an SSH key pair is set; use SSM Session Manager"))
    for item in _of_type(plan, "aws:ec2/instance:Instance"):
        matched += 1
        inputs = item["inputs"]
        if (inputs.get("metadataOptions") or {}).get("httpTokens") != "required":
            violations.append(Violation(name, _label(item), "IMDSv2 not required (metadataOptions.httpTokens)"))
        volumes = [inputs.get("rootBlockDevice") or {}, *_as_list(inputs.get("ebsBlockDevices"))]
        if not all(_truthy(volume.get("encrypted")) for volume in volumes):
            violations.append(Violation(name, _label(item), "a volume is not encrypted"))
    for item in _of_type(plan, "aws:ebs/volume:Volume"):
        if not _truthy(item["inputs"].get("encrypted")):
            violations.append(Violation(name, _label(item), "EBS volume not encrypted"))
    for item in plan:
        if item.get("custom") and _is_node_class(item["type"]):
            matched += 1
            spec = item["inputs"].get("spec") or {}
            if (spec.get("metadataOptions") or {}).get("httpTokens") != "required":
                violations.append(Violation(name, _label(item), "IMDSv2 not required (spec.metadataOptions)"))
            violations += [Violation(name, _label(item), p) for p in _ebs_problems(spec.get("blockDeviceMappings"))]
    _require_matches(name, matched, "launch template, instance or EC2NodeClass")
    return violations


def _cidrs(rule: Mapping[str, Any]) -> list[str]:
    keys = ("cidrBlocks", "ipv6CidrBlocks", "cidrIpv4", "cidrIpv6")
    return [str(cidr) for key in keys for cidr in _as_list(rule.get(key))]


def _open_cidrs(cidrs: list[str]) -> set[str]:
    """The internet-wide blocks the CIDRs cover together: `0.0.0.0/1` + `128.0.0.0/1` is `0.0.0.0/0`."""
    networks = [ipaddress.ip_network(cidr, strict=False) for cidr in cidrs]
    v4 = ipaddress.collapse_addresses(net for net in networks if isinstance(net, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(net for net in networks if isinstance(net, ipaddress.IPv6Network))
    return {str(net) for net in [*v4, *v6]} & OPEN_CIDRS


SECURITY_GROUPS = ("aws:ec2/securityGroup:SecurityGroup", "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")


def _ingress_by_group(plan: Plan) -> Iterator[tuple[Resource, list[str]]]:
    """Each group with the CIDRs all its ingress admits (its own rules and the rule resources naming it, joined
    by URN as `refers_to` does), and each rule resource naming no group of the plan on its own."""
    groups = _of_type(plan, *SECURITY_GROUPS)
    rules = [
        rule
        for rule in _of_type(plan, "aws:ec2/securityGroupRule:SecurityGroupRule")
        if rule["inputs"].get("type") == "ingress"
    ] + _of_type(plan, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    joined: set[int] = set()
    for group in groups:
        cidrs = [cidr for rule in _as_list(group["inputs"].get("ingress")) for cidr in _cidrs(rule)]
        for rule in rules:
            if refers_to(rule, "securityGroupId", group):
                joined.add(id(rule))
                cidrs += _cidrs(rule["inputs"])
        yield group, cidrs
    yield from ((rule, _cidrs(rule["inputs"])) for rule in rules if id(rule) not in joined)


LOAD_BALANCERS = ("aws:lb/loadBalancer:LoadBalancer", "aws:alb/loadBalancer:LoadBalancer")
CLASSIC_LOAD_BALANCER = "aws:elb/loadBalancer:LoadBalancer"


def check_security_groups(plan: Plan) -> list[Violation]:
    """No security group admits traffic from 0.0.0.0/0 or ::/0 (its rules' CIDRs collapsed together, wherever they
    are declared), and no load balancer faces the internet."""
    name = "security-groups"
    violations: list[Violation] = []
    matched = 0
    for item, cidrs in _ingress_by_group(plan):
        matched += 1
        wide = sorted(_open_cidrs(cidrs))
        if not wide:
            continue
        together = "" if set(wide) <= set(cidrs) else f" (together: {sorted(set(cidrs))})"
        if item["type"] in SECURITY_GROUPS:
            violations.append(Violation(name, _label(item), f"ingress from {wide}{together}"))
        else:
            violations.append(Violation(name, _label(item), f"ingress rule from the internet{together}"))
    for item in _of_type(plan, *LOAD_BALANCERS, CLASSIC_LOAD_BALANCER):
        if not _truthy(item["inputs"].get("internal")):
            violations.append(Violation(name, _label(item), "internet-facing load balancer (internal is not true)"))
    _require_matches(name, matched, "security group or security group rule")
    return violations


# --- container images -------------------------------------------------------------------------------------


def _repository_problems(inputs: Mapping[str, Any]) -> list[str]:
    problems = []
    if inputs.get("imageTagMutability") != "IMMUTABLE":
        problems.append("tags are mutable: a tag could later name a different image")
    if not (inputs.get("imageScanningConfiguration") or {}).get("scanOnPush"):
        problems.append("images are not scanned on push")
    encryption = _as_list(inputs.get("encryptionConfigurations"))
    if not any(item.get("encryptionType") == "KMS" and item.get("kmsKey") for item in encryption):
        problems.append("not encrypted with the stack's KMS key")
    return problems


def check_images(plan: Plan) -> list[Violation]:
    """ECR repositories: immutable tags, scan on push, KMS, a lifecycle policy. Built images: pushed only to a
    repository of this plan, under a pinned tag (never `latest`)."""
    name = "images"
    violations: list[Violation] = []
    repositories = _of_type(plan, "aws:ecr/repository:Repository")
    _require_matches(name, len(repositories), "ECR repository")
    policies = _of_type(plan, "aws:ecr/lifecyclePolicy:LifecyclePolicy")
    governed = {item["inputs"].get("repository") for item in policies}
    urls = {str(item["outputs"].get("repositoryUrl")) for item in repositories}
    for item in repositories:
        violations += [Violation(name, _label(item), p) for p in _repository_problems(item["inputs"])]
        if item["inputs"].get("name") not in governed:
            violations.append(Violation(name, _label(item), "no lifecycle policy: old images pile up"))
    for item in _of_type(plan, "docker-build:index:Image"):
        for tag in _as_list(item["inputs"].get("tags")):
            repository, _, label = str(tag).rpartition(":")
            if repository not in urls:
                violations.append(Violation(name, _label(item), f"{tag} is not in a repository of this stack"))
            if label in ("", "latest"):
                violations.append(Violation(name, _label(item), f"{tag} is not a pinned tag"))
    return violations


RULES: dict[str, Rule] = {
    "cost-tags": Rule(check_cost_tags, "tag it CostCenter (provider default tags, or its own / tagSpecifications)"),
    "buckets": Rule(
        check_buckets,
        "use the DataBucket component: SSE-KMS with the stack key, public access "
        "blocked, a policy denying aws:SecureTransport false",
    ),
    "iam": Rule(
        check_iam, "name actions and resources; a needed exception goes in infra/rules/iam_allowlist.py with its reason"
    ),
    "launch-templates": Rule(check_launch_templates, "httpTokens required, encrypted volumes, no key pair"),
    "security-groups": Rule(
        check_security_groups,
        "allow ingress from security groups or the VPC, never 0.0.0.0/0 (however split); load balancers internal",
    ),
    "images": Rule(check_images, "immutable tags, scan on push, the stack key, a lifecycle policy, pinned tags"),
    "volume-keys": Rule(
        checks_kms.check_volume_keys,
        "put node volumes on the stack key and let the launching role use it (infra/rules/checks_kms.py)",
    ),
    "alert-keys": Rule(
        checks_kms.check_alert_keys,
        "give events.amazonaws.com its own key statement without aws:SourceAccount (infra/components/kms.py)",
    ),
    "cost-scope": Rule(checks_costs.check_cost_scope, "scope cost alarms and budgets to this stack's tags"),
    "cost-tag-activation": Rule(checks_costs.check_cost_tag_activation, "activate the CostCenter cost tag"),
    "eks-support": Rule(
        checks_costs.check_eks_support,
        "set the cluster's upgrade policy (llm-batch:eks.support_type) and the node groups' version to the cluster's",
        CLUSTER_TIERS,
    ),
    **{
        name: Rule(check, "make the resource wait for what it names (depends_on)", CLUSTER_TIERS)
        for name, check in checks_order.CHECKS.items()
    },
    **checks_iam.RULES,
    **checks_network.RULES,
    **checks_k8s.RULES,
    **checks_ray.RULES,
    **checks_stores.RULES,
    **checks_credentials.RULES,
    **checks_egress.RULES,
    **checks_egress_path.RULES,
    **checks_batch_api.RULES,
    **checks_cross_account.RULES,
}
# Each check by name (every rule, whatever its tiers).
CHECKS: dict[str, Callable[[Plan], list[Violation]]] = {name: rule.check for name, rule in RULES.items()}


class PolicyError(Exception):
    """A plan broke a rule: the message names each resource, rule and fix."""


def rules_for(plan: Plan) -> dict[str, Rule]:
    """The rules for the plan's tier; a plan that does not say its tier gets every rule."""
    tier = tier_of(plan)
    return {name: rule for name, rule in RULES.items() if tier is None or tier in rule.tiers}


def run_checks(plan: Plan) -> list[Violation]:
    """The rules for the plan's tier over it; raises NothingMatched from the first rule that saw nothing."""
    return [violation for rule in rules_for(plan).values() for violation in rule.check(plan)]


def report(plan: Plan) -> tuple[list[str], bool]:
    """One line per rule (`ok`, `FAIL`, `n/a` for other tiers), each violation with its fix; and whether all passed."""
    lines: list[str] = []
    clean = True
    applicable = rules_for(plan)
    for name, rule in RULES.items():
        if name not in applicable:
            lines.append(f"n/a  {name} (tiers {', '.join(sorted(rule.tiers))})")
            continue
        try:
            violations = rule.check(plan)
        except NothingMatched as error:
            lines.append(f"FAIL {name}: {error}")
            clean = False
            continue
        lines.append(f"{'FAIL' if violations else 'ok  '} {name}")
        for violation in violations:
            lines.append(f"     {violation}")
        if violations:
            lines.append(f"     fix: {rule.fix}")
        clean = clean and not violations
    return lines, clean


def preview_line(plan: Plan) -> str | None:
    """The rules of the plan's tier that read a value unknown until its resources exist (`policy_stack.
    preview_only`), as one line; None when there are none. Offline they judge what the mocks invented; the
    policy pack judges them on `pulumi up`, and on a first `pulumi preview` reports them as not yet judged."""
    from infra.rules.policy_stack import preview_only

    found = preview_only(plan, rules_for(plan))
    if not found:
        return None
    return f"judged here on mock ids/ARNs, for real only by the policy pack on `pulumi up`: {', '.join(found)}"


def gate(plan: Plan) -> None:
    """Raise PolicyError naming every violation (resource, rule, fix) when the plan breaks a rule."""
    lines, clean = report(plan)
    if not clean:
        failed = [line for line in lines if not line.startswith(("ok", "n/a"))]
        raise PolicyError("the plan breaks the security/policy rules:\n" + "\n".join(failed))
