"""Plan checks on paths that carry this stack's data or trust to another account.

- `cross-account`: a KMS grant to a principal of another account, S3 replication to a bucket of another
  account (or to a bucket this plan does not create: S3 ARNs name no owner), a log subscription delivering to
  another account's destination, and a Cognito identity-pool trust without its `aud` and `amr` conditions
  (any identity pool of any account could then assume the role) are refused, unless the account or ARN is
  listed in `CROSS_ACCOUNT_ALLOWLIST` with the reason it is trusted. The list is empty: nothing this
  project ships sends data elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from infra.rules.checks_iam import Account, plan_account
from infra.rules.plan_view import (
    Plan,
    Resource,
    Rule,
    Violation,
    allow_statements,
    as_list,
    label,
    of_type,
    principals,
    require_matches,
)

# Account id or full ARN -> why data or trust may go there. Add an entry rather than weakening the check.
CROSS_ACCOUNT_ALLOWLIST: dict[str, str] = {}

GRANT = "aws:kms/grant:Grant"
REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
LEGACY_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
SUBSCRIPTION = "aws:cloudwatch/logSubscriptionFilter:LogSubscriptionFilter"
COGNITO = "cognito-identity.amazonaws.com"


def arn_account(arn: str) -> str:
    """The account field of an ARN ('' when it has none, as S3's)."""
    parts = arn.split(":", 5)
    return parts[4] if len(parts) == 6 and parts[0] == "arn" else ""


def allowed(*names: str) -> bool:
    return any(name and name in CROSS_ACCOUNT_ALLOWLIST for name in names)


def _foreign(arn: str, account: Account) -> bool:
    """Whether an ARN names an account other than this plan's (unknowable when the plan's account is)."""
    owner = arn_account(arn)
    if not owner or allowed(owner, arn):
        return False
    mine = account()
    return mine is not None and owner != mine


def _grant_problems(item: Resource, account: Account) -> Iterator[str]:
    for key in ("granteePrincipal", "retiringPrincipal"):
        principal = str(item["inputs"].get(key) or "")
        if _foreign(principal, account):
            yield f"{key} {principal} is in account {arn_account(principal)}: it may use the key from there"


def _replication_rules(plan: Plan) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    for item in of_type(plan, REPLICATION):
        for rule in as_list(item["inputs"].get("rules")):
            yield item, rule
    for item in of_type(plan, *LEGACY_BUCKETS):
        for config in as_list(item["inputs"].get("replicationConfiguration")):
            for rule in as_list(config.get("rules")):
                yield item, rule


def _replication_problems(rule: Mapping[str, Any], account: Account, own_buckets: set[str]) -> Iterator[str]:
    destination = rule.get("destination") or {}
    bucket = str(destination.get("bucket") or "")
    owner = str(destination.get("account") or destination.get("accountId") or "")
    if owner and not allowed(owner, bucket) and (mine := account()) is not None and owner != mine:
        yield f"replicates to account {owner}"
    elif bucket not in own_buckets and not allowed(owner, bucket):
        yield f"replicates to {bucket or 'an unnamed bucket'}, not a bucket of this stack"


def _cognito_problems(statement: Mapping[str, Any]) -> Iterator[str]:
    if COGNITO not in principals(statement, "Federated"):
        return
    conditions = {
        (str(operator), str(key).lower()): [str(value) for value in as_list(values)]
        for operator, block in (statement.get("Condition") or {}).items()
        if isinstance(block, dict)
        for key, values in block.items()
    }
    audience = conditions.get(("StringEquals", f"{COGNITO}:aud"), [])
    if not audience or any("*" in value or "?" in value for value in audience):
        yield "Cognito trust without StringEquals cognito-identity.amazonaws.com:aud = the identity pool id"
    if not any(key == f"{COGNITO}:amr" for _, key in conditions):
        yield "Cognito trust without a cognito-identity.amazonaws.com:amr condition (authenticated or not)"


def check_cross_account(plan: Plan) -> list[Violation]:
    name = "cross-account"
    # Asked only when a grant, replication or subscription exists: a first preview cannot know the account.
    account = plan_account(plan)
    violations: list[Violation] = []
    for item in of_type(plan, GRANT):
        violations += [Violation(name, label(item), problem) for problem in _grant_problems(item, account)]
    replication = list(_replication_rules(plan))
    own_buckets = (
        {str((item.get("outputs") or {}).get("arn")) for item in of_type(plan, *LEGACY_BUCKETS)}
        if replication
        else set()
    )
    for item, rule in replication:
        violations += [
            Violation(name, label(item), problem) for problem in _replication_problems(rule, account, own_buckets)
        ]
    for item in of_type(plan, SUBSCRIPTION):
        destination = str(item["inputs"].get("destinationArn") or "")
        if _foreign(destination, account):
            violations.append(Violation(name, label(item), f"delivers logs to account {arn_account(destination)}"))
    roles = of_type(plan, "aws:iam/role:Role")
    for item in roles:
        for statement in allow_statements(item["inputs"].get("assumeRolePolicy")):
            violations += [Violation(name, label(item), problem) for problem in _cognito_problems(statement)]
    # Every plan has roles: a plan without them would be one this check cannot read.
    require_matches(name, len(roles), "IAM role")
    return violations


RULES: dict[str, Rule] = {
    "cross-account": Rule(
        check_cross_account,
        "keep grants, replication and log subscriptions in this account, or list the account in "
        "infra/rules/checks_cross_account.py CROSS_ACCOUNT_ALLOWLIST with its reason; a Cognito trust pins "
        "cognito-identity.amazonaws.com:aud (StringEquals) and :amr",
    ),
}
