"""Plan checks that reason about what an IAM statement allows, not about how it is spelled.

- `passrole`: iam:PassRole (however granted: `iam:Pass*`, `iam:*`, `*`) only on named roles; a wildcard in the
  role part of an ARN (`arn:aws:iam::123456789012:role/*`) lets the caller hand any role to a service.
- `kms-admin`: no identity policy may administer a KMS key (create, put policy, schedule deletion, ...); the
  key policy's administrator statement is where that lives. `kms:Create*` and `kms:Put*` expand to those.
- `kms-via-service`: an identity policy that lets a role encrypt or decrypt with a key pins the services it
  goes through (kms:ViaService), so the role's credentials alone cannot decrypt data directly.
- `trust`: a web-identity (IRSA) trust names one service account exactly, with `sts.amazonaws.com` audience;
  an AWS principal of another account needs `sts:ExternalId`; `*` needs a condition that narrows it.
- `resource-principals`: a resource policy (key, bucket, topic, queue, secret, repository, endpoint) that
  allows `Principal: *` must narrow it with a condition on who calls (account, ARN, organisation, source);
  a condition on something else (the time, TLS, an encryption context) leaves it open to the world.
- `service-principals`: a queue, topic or bucket policy lets an AWS service in only on behalf of this
  account (aws:SourceAccount, aws:SourceArn, ...): otherwise any account's rule, alarm or bucket can make
  the service deliver into ours (the confused deputy).
- `key-logs-scope`: a key policy lets CloudWatch Logs use the key only for this stack's log groups
  (`/llm-batch/<stack>/...` through kms:EncryptionContext:aws:logs:arn), and still for each of them.
- `lambda-permissions`: every Lambda permission kind (function, layer, URL) names a principal, and a service
  principal is pinned to this account or a source ARN.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any

from infra.rules.plan_view import (
    Plan,
    Resource,
    Rule,
    Violation,
    allow_statements,
    as_json,
    as_list,
    grants,
    label,
    of_type,
    principals,
    require_matches,
    statements,
)

IDENTITY_DOCUMENTS = ("aws:iam/policy:Policy", "aws:iam/rolePolicy:RolePolicy", "aws:iam/userPolicy:UserPolicy")
RESOURCE_DOCUMENTS = (
    "aws:kms/key:Key",
    "aws:s3/bucketPolicy:BucketPolicy",
    "aws:sns/topicPolicy:TopicPolicy",
    "aws:sqs/queuePolicy:QueuePolicy",
    "aws:secretsmanager/secretPolicy:SecretPolicy",
    "aws:ecr/repositoryPolicy:RepositoryPolicy",
    "aws:ec2/vpcEndpoint:VpcEndpoint",
    "aws:kms/keyPolicy:KeyPolicy",
    # A PRIVATE REST API is reachable only through VPC endpoints, but any account's endpoint will do unless the
    # policy pins aws:SourceVpce (or the caller): `Principal: *` alone is every account's VPC.
    "aws:apigateway/restApi:RestApi",
    "aws:apigateway/restApiPolicy:RestApiPolicy",
)
# KMS actions that manage a key rather than use it: only the key policy's administrator statement grants them.
KMS_ADMIN_ACTIONS = (
    "kms:CreateKey",
    "kms:CreateAlias",
    "kms:CreateCustomKeyStore",
    "kms:PutKeyPolicy",
    "kms:ScheduleKeyDeletion",
    "kms:CancelKeyDeletion",
    "kms:DisableKey",
    "kms:EnableKey",
    "kms:DisableKeyRotation",
    "kms:DeleteAlias",
    "kms:UpdateAlias",
    "kms:UpdateKeyDescription",
    "kms:ImportKeyMaterial",
    "kms:DeleteImportedKeyMaterial",
    "kms:ReplicateKey",
    "kms:UpdatePrimaryRegion",
)
# Condition keys that say who may call: with a concrete value they turn `*` into known callers.
NARROWING_KEYS = frozenset(
    key.lower()
    for key in (
        "aws:PrincipalAccount",
        "aws:PrincipalArn",
        "aws:PrincipalOrgID",
        "aws:PrincipalOrgPaths",
        "aws:SourceAccount",
        "aws:SourceArn",
        "aws:SourceOwner",
        "aws:SourceVpce",
        "aws:SourceVpc",
        "kms:CallerAccount",
    )
)
LAMBDA_PERMISSIONS = ("aws:lambda/permission:Permission", "aws:lambda/layerVersionPermission:LayerVersionPermission")
FUNCTION_URL = "aws:lambda/functionUrl:FunctionUrl"
ACCOUNT = re.compile(r"^arn:[a-z-]+:iam::(\d{12}):")


def _identity_documents(plan: Plan) -> Iterator[tuple[Resource, Any]]:
    for item in of_type(plan, *IDENTITY_DOCUMENTS):
        yield item, as_json(item["inputs"].get("policy"))
    for item in of_type(plan, "aws:iam/role:Role"):
        for inline in as_list(item["inputs"].get("inlinePolicies")):
            if inline.get("policy"):
                yield item, as_json(inline["policy"])


def _sid(statement: Mapping[str, Any]) -> str:
    return str(statement.get("Sid", "(no Sid)"))


def _wild(value: str) -> bool:
    return "*" in value or "?" in value


def check_passrole(plan: Plan) -> list[Violation]:
    name = "passrole"
    violations: list[Violation] = []
    matched = 0
    for item, document in _identity_documents(plan):
        for statement in allow_statements(document):
            matched += 1
            if not grants(statement, "iam:PassRole"):
                continue
            if "NotResource" in statement:
                violations.append(Violation(name, label(item), f"{_sid(statement)}: iam:PassRole with NotResource"))
            for resource in map(str, as_list(statement.get("Resource"))):
                role_part = resource.split(":role/", 1)[1] if ":role/" in resource else resource
                if _wild(role_part) or _wild(resource.split(":role/", 1)[0]):
                    violations.append(
                        Violation(name, label(item), f"{_sid(statement)}: iam:PassRole on {resource!r} (any role)")
                    )
    require_matches(name, matched, "identity policy statement")
    return violations


def check_kms_admin(plan: Plan) -> list[Violation]:
    name = "kms-admin"
    violations: list[Violation] = []
    matched = 0
    for item, document in _identity_documents(plan):
        for statement in allow_statements(document):
            matched += 1
            admin = [action for action in KMS_ADMIN_ACTIONS if grants(statement, action)]
            if admin:
                violations.append(Violation(name, label(item), f"{_sid(statement)}: grants key administration {admin}"))
    require_matches(name, matched, "identity policy statement")
    return violations


KMS_DATA_ACTIONS = ("kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom")


def check_kms_via_service(plan: Plan) -> list[Violation]:
    name = "kms-via-service"
    violations: list[Violation] = []
    matched = 0
    for item, document in _identity_documents(plan):
        for statement in allow_statements(document):
            if not any(grants(statement, action) for action in KMS_DATA_ACTIONS):
                continue
            matched += 1
            pinned = [
                values
                for operator, key, values in _conditions(statement)
                if key == "kms:viaservice" and operator in ("StringEquals", "ForAnyValue:StringEquals")
            ]
            if not pinned or any(_wild(value) for values in pinned for value in values):
                violations.append(
                    Violation(name, label(item), f"{_sid(statement)}: uses a KMS key with no kms:ViaService condition")
                )
    require_matches(name, matched, "identity policy statement using a KMS key")
    return violations


def _conditions(statement: Mapping[str, Any]) -> Iterator[tuple[str, str, list[str]]]:
    """(operator, key, values) of each condition, keys in lower case."""
    for operator, block in (statement.get("Condition") or {}).items():
        if isinstance(block, dict):
            for key, values in block.items():
                yield str(operator), str(key).lower(), [str(value) for value in as_list(values)]


# An interface endpoint's policy grants nothing (the identity and resource policies still must); it limits what
# passes through the endpoint, so pinning the resource to this account narrows it as pinning the caller does.
# That is how the sts endpoint is limited: IRSA's AssumeRoleWithWebIdentity has no calling account.
ENDPOINT_NARROWING_KEYS = NARROWING_KEYS | {"aws:resourceaccount"}


# Keys whose value is an ARN: a wildcard in it still names known callers when its account is this one's (or, for
# services whose ARNs carry no account, like S3, when the resource's name is whole).
ARN_KEYS = frozenset({"aws:principalarn", "aws:sourcearn"})
# A path of an organisation: `o-abc/r-root/ou-1/*` pins the organisation before the wildcard.
PATH_KEYS = frozenset({"aws:principalorgpaths"})


Account = Callable[[], "str | None"]


def no_account() -> str | None:
    return None


def pins_arn(arn: str, account: Account = no_account) -> bool:
    """Whether an ARN pattern names callers of known accounts: whole, or its account field this account's (or
    whole, when the plan's account is unknown), or, in an ARN without an account, a resource named in full.
    `account` is asked only for a pattern with a wildcard: the plan's account comes from its roles' ARNs, which
    a first preview does not know, so a plan of whole ARNs is judged at preview (docs/security.md)."""
    if not _wild(arn):
        return True
    parts = arn.split(":", 5)
    if len(parts) < 6 or any(_wild(part) for part in parts[:3]):
        return False  # `arn:*:...`, `arn:aws:*:...`: which service's ARN it is is unknown
    owner = parts[4]
    if owner:
        if _wild(owner):
            return False
        mine = account()
        return mine is None or owner == mine
    return not _wild(re.split(r"[/:]", parts[5], maxsplit=1)[0])


def pins_value(key: str, value: str, account: Account = no_account) -> bool:
    """Whether one condition value names known callers: a wildcard in an account, organisation or principal
    segment lets in anyone unless the rest pins this account, the organisation or one resource."""
    if key in ARN_KEYS:
        return pins_arn(value, account)
    if key in PATH_KEYS:
        return not _wild(value.split("/", 1)[0])
    return not _wild(value)


def plan_account(plan: Plan) -> Account:
    """The plan's account, looked up the first time it is asked for."""
    return cache(lambda: own_account(plan))


def narrows_principal(
    statement: Mapping[str, Any], keys: frozenset[str] = NARROWING_KEYS, account: Account = no_account
) -> bool:
    """Whether a condition limits who may call to known accounts, ARNs, an organisation or a source."""
    for operator, key, values in _conditions(statement):
        if operator.endswith("IfExists") or operator.startswith("Not") or operator == "Null":
            continue  # absent keys pass IfExists; Not* and Null say who is excluded, not who is let in
        if key in keys and values and all(pins_value(key, value, account) for value in values):
            return True
    return False


def own_account(plan: Plan) -> str | None:
    """The account the plan deploys to, from the ARNs of its own roles."""
    accounts = Counter(
        match.group(1)
        for item in of_type(plan, "aws:iam/role:Role")
        if (match := ACCOUNT.match(str((item.get("outputs") or {}).get("arn", ""))))
    )
    return accounts.most_common(1)[0][0] if accounts else None


def _trust_problems(statement: Mapping[str, Any], account: str | None) -> list[str]:
    problems = []
    conditions = list(_conditions(statement))
    for provider in principals(statement, "Federated"):
        if ":oidc-provider/" not in provider:
            continue
        issuer = provider.split(":oidc-provider/", 1)[1].lower()
        subjects = [(op, values) for op, key, values in conditions if key == f"{issuer}:sub"]
        audiences = [values for op, key, values in conditions if key == f"{issuer}:aud"]
        if not subjects:
            problems.append("web-identity trust without a service-account subject: any pod of the cluster")
        for operator, values in subjects:
            if operator != "StringEquals" or any(_wild(value) for value in values):
                problems.append(f"web-identity subject {operator} {values}: must name one service account exactly")
        if not any(values == ["sts.amazonaws.com"] for values in audiences):
            problems.append("web-identity trust without the audience sts.amazonaws.com")
    for principal in principals(statement, "AWS"):
        if principal == "*":
            if not narrows_principal(statement, account=lambda: account):
                problems.append("trusts every AWS principal without a condition that narrows it")
            continue
        match = re.match(r"^(?:arn:[a-z-]+:iam::)?(\d{12})", principal)
        if match and account and match.group(1) != account:
            external = [values for op, key, values in conditions if key == "sts:externalid" and op == "StringEquals"]
            if not external or any(_wild(value) for values in external for value in values):
                problems.append(f"trusts account {match.group(1)} without an sts:ExternalId condition")
    return problems


def check_trust(plan: Plan) -> list[Violation]:
    name = "trust"
    violations: list[Violation] = []
    account = own_account(plan)
    roles = of_type(plan, "aws:iam/role:Role")
    for item in roles:
        for statement in allow_statements(item["inputs"].get("assumeRolePolicy")):
            violations += [
                Violation(name, label(item), f"{_sid(statement)}: {problem}")
                for problem in _trust_problems(statement, account)
            ]
    require_matches(name, len(roles), "IAM role")
    return violations


def check_resource_principals(plan: Plan) -> list[Violation]:
    name = "resource-principals"
    violations: list[Violation] = []
    matched = 0
    account = plan_account(plan)
    for item in of_type(plan, *RESOURCE_DOCUMENTS):
        for statement in statements(item["inputs"].get("policy")):
            matched += 1
            if statement.get("Effect") != "Allow" or "*" not in principals(statement, "AWS"):
                continue
            endpoint = item["type"] == "aws:ec2/vpcEndpoint:VpcEndpoint"
            if not narrows_principal(statement, ENDPOINT_NARROWING_KEYS if endpoint else NARROWING_KEYS, account):
                violations.append(
                    Violation(
                        name,
                        label(item),
                        f"{_sid(statement)}: allows Principal * and no condition limits the caller "
                        f"({sorted(key for _, key, _ in _conditions(statement)) or 'no condition'})",
                    )
                )
    require_matches(name, matched, "resource policy statement")
    return violations


def check_lambda_permissions(plan: Plan) -> list[Violation]:
    name = "lambda-permissions"
    violations: list[Violation] = []
    functions = of_type(plan, "aws:lambda/function:Function")
    account = plan_account(plan)
    for item in of_type(plan, *LAMBDA_PERMISSIONS):
        inputs = item["inputs"]
        principal = str(inputs.get("principal", ""))
        if principal == "*":
            violations.append(Violation(name, label(item), "principal '*': anyone may invoke or use it"))
        elif principal.endswith(".amazonaws.com"):
            source_arn, source_account = str(inputs.get("sourceArn") or ""), str(inputs.get("sourceAccount") or "")
            if not (source_arn or source_account):
                violations.append(
                    Violation(name, label(item), f"service principal {principal} with no sourceArn or sourceAccount")
                )
            elif not ((source_account and not _wild(source_account)) or (source_arn and pins_arn(source_arn, account))):
                violations.append(
                    Violation(
                        name,
                        label(item),
                        f"service principal {principal} for {source_arn or source_account!r}: "
                        "a wildcard in its account lets any account's resources invoke it",
                    )
                )
    for item in of_type(plan, FUNCTION_URL):
        if item["inputs"].get("authorizationType") != "AWS_IAM":
            violations.append(Violation(name, label(item), "function URL without IAM auth: public"))
    require_matches(name, len(functions), "Lambda function")
    return violations


SERVICE_DOCUMENTS = (
    "aws:sqs/queuePolicy:QueuePolicy",
    "aws:sns/topicPolicy:TopicPolicy",
    "aws:s3/bucketPolicy:BucketPolicy",
)


def check_service_principals(plan: Plan) -> list[Violation]:
    name = "service-principals"
    violations: list[Violation] = []
    matched = 0
    account = plan_account(plan)
    for item in of_type(plan, *SERVICE_DOCUMENTS):
        for statement in allow_statements(item["inputs"].get("policy")):
            matched += 1
            services = principals(statement, "Service")
            if services and not narrows_principal(statement, account=account):
                violations.append(
                    Violation(name, label(item), f"{_sid(statement)}: {services} may act for any account")
                )
    require_matches(name, matched, "queue, topic or bucket policy statement")
    return violations


LOGS_CONTEXT = "kms:encryptioncontext:aws:logs:arn"


def _stack_name(plan: Plan) -> str | None:
    stacks = [item for item in plan if item["type"] == "pulumi:pulumi:Stack"]
    return str(stacks[0]["name"]).removeprefix("llm-batch-") if stacks else None


def check_key_logs_scope(plan: Plan) -> list[Violation]:
    name = "key-logs-scope"
    violations: list[Violation] = []
    stack = _stack_name(plan)
    groups = of_type(plan, "aws:cloudwatch/logGroup:LogGroup")
    matched = 0
    for key in of_type(plan, "aws:kms/key:Key"):
        key_arn = str((key.get("outputs") or {}).get("arn"))
        own = [str((g.get("outputs") or {}).get("arn")) for g in groups if g["inputs"].get("kmsKeyId") == key_arn]
        for statement in allow_statements(key["inputs"].get("policy")):
            if not any(service.startswith("logs.") for service in principals(statement, "Service")):
                continue
            matched += 1
            patterns = [
                value
                for operator, condition_key, values in _conditions(statement)
                if condition_key == LOGS_CONTEXT and operator in ("ArnLike", "ArnEquals", "StringLike", "StringEquals")
                for value in values
            ]
            if not patterns:
                violations.append(
                    Violation(
                        name,
                        label(key),
                        f"{_sid(statement)}: CloudWatch Logs may use the key "
                        "for any log group (no kms:EncryptionContext:aws:logs:arn condition)",
                    )
                )
                continue
            sibling = f"log-group:/llm-batch/{stack}-other/x"
            for pattern in patterns:
                prefix = pattern.split("log-group:", 1)[0]
                if fnmatch.fnmatchcase(prefix + sibling, pattern) or "log-group:*" in pattern:
                    violations.append(
                        Violation(name, label(key), f"{_sid(statement)}: {pattern} covers other stacks' log groups")
                    )
            for group_arn in own:
                if not any(fnmatch.fnmatchcase(group_arn, pattern) for pattern in patterns):
                    violations.append(
                        Violation(name, label(key), f"{_sid(statement)}: log group {group_arn} cannot use the key")
                    )
    require_matches(name, matched, "key policy statement for CloudWatch Logs")
    return violations


RULES: dict[str, Rule] = {
    "passrole": Rule(check_passrole, "name each role that may be passed in full; no wildcard in the role ARN"),
    "kms-admin": Rule(
        check_kms_admin, "grant only key use (Decrypt, GenerateDataKey, ...); administration is the key policy's"
    ),
    "kms-via-service": Rule(
        check_kms_via_service,
        "add Condition StringEquals kms:ViaService = [<service>.<region>.amazonaws.com] "
        "(infra.components.iam.via_services)",
    ),
    "trust": Rule(
        check_trust,
        "IRSA: StringEquals on <issuer>:sub = system:serviceaccount:<ns>:<name> and :aud = sts.amazonaws.com; "
        "another account: a StringEquals sts:ExternalId condition",
    ),
    "resource-principals": Rule(
        check_resource_principals,
        "name the principal, or add a condition on aws:PrincipalAccount/aws:SourceAccount/aws:PrincipalArn",
    ),
    "service-principals": Rule(
        check_service_principals, "add Condition StringEquals aws:SourceAccount = this account (or aws:SourceArn)"
    ),
    "key-logs-scope": Rule(
        check_key_logs_scope,
        "condition the logs statement on kms:EncryptionContext:aws:logs:arn = "
        "arn:...:log-group:/llm-batch/<stack>/* (infra/components/kms.py)",
    ),
    "lambda-permissions": Rule(
        check_lambda_permissions, "name the invoking service or account, with sourceArn or sourceAccount"
    ),
}
