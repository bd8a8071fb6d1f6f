"""The IAM policy the identity that runs `pulumi up` needs, derived from what the three plans create.

    python -m infra.ops.deployer_policy            # rewrites docs/deployer-policy.json and its parts from the plans,
                                                   # and docs/role-boundary.json (infra/ops/role_boundary_document.py)
    python -m infra.ops.deployer_policy --check    # exit 1 when a committed document is stale

Each resource type maps, in infra/ops/deployer_actions.py, to the calls that create, read, update, delete and
tag it (remote components, whose inner resources a plan never shows, to those inner resources' calls). The document
grants their union, grouped by scope: each service's writes on the stack's `llm-batch-*` names; IAM roles and KMS
keys, whose names are generated, by the `Project` cost tag (on create, the tag the request carries); `iam:PassRole`
only on the project's tagged roles and only to the services that take them; the role writes that could give a
role more than the deployer holds only when the role carries the permissions boundary (infra/role_boundary.py),
which the deployer may neither remove nor rewrite; Describe/List calls and the services
that name resources by generated ids (EC2, EKS, Cost Explorer) on `*`. A type the table does not know fails the
check, naming the type, so a new resource type cannot ship without its permission.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.ops.deployer_actions import (
    ACTIONS,
    ANYWHERE,
    BOUNDARY_POLICY,
    BOUNDARY_WRITES,
    BOUNDED_ROLE_WRITES,
    LOOKUPS,
    NAMED,
    PASSED_TO,
    PREFIX,
    PROJECT,
    PROJECT_TAG,
    REQUEST_PROJECT,
    REQUIRE_BOUNDARY,
    SERVICE_LINKED,
    TAGGED,
    TAGGED_PROJECT,
    UNSCOPED,
)
from infra.ops.role_boundary_document import DOCUMENT as BOUNDARY_DOCUMENT
from infra.ops.role_boundary_document import boundary_document
from infra.ops.stacks import ROOT

DOCUMENT = ROOT / "docs" / "deployer-policy.json"
STACKS = ("small", "medium", "large")
# IAM's limit on a customer-managed policy, in characters without whitespace; a role may hold 10 (20 on request).
MANAGED_POLICY_LIMIT = 6144
# Opt-in features whose resources no default plan shows: every stack is planned once more with all of its tier's
# features on (the Batch API everywhere, serving on the cluster tiers), so the deployer of a stack that turns one on
# has its services too. The medium plan also asks for serving's internal load balancer.
BATCH_API_ON: Mapping[str, Any] = {"batch_api.enabled": True, "batch_api.public_endpoint_acknowledged": True}
SERVE_ON: Mapping[str, Any] = {"serve.enabled": True, "eks.head_instance_type": "m5.2xlarge"}
OPT_IN: Mapping[str, Mapping[str, Any]] = {
    "small": BATCH_API_ON,
    "medium": {**BATCH_API_ON, **SERVE_ON, "serve.internal_load_balancer": True},
    "large": {**BATCH_API_ON, **SERVE_ON},
}

# Types that create nothing in AWS: Kubernetes objects (the cluster's API), providers, components.
NOT_AWS_PREFIXES = ("kubernetes:", "pulumi:", "llmbatch:")


class UnknownResourceType(ValueError):
    """A type in a plan that the action table (infra/ops/deployer_actions.py) does not cover."""


def actions_for(types: Iterable[str]) -> set[str]:
    """The IAM actions the given resource types need; UnknownResourceType names any type the table lacks."""
    actions: set[str] = set(LOOKUPS)
    unknown = []
    for type_token in types:
        if type_token.startswith(NOT_AWS_PREFIXES):
            continue
        if type_token in ACTIONS:
            actions.update(ACTIONS[type_token])
        else:
            unknown.append(type_token)
    if unknown:
        raise UnknownResourceType(
            f"no deployer permission known for {sorted(set(unknown))}: add the type, with the calls the provider "
            "makes to create, read, update, delete and tag it, to ACTIONS in infra/ops/deployer_actions.py"
        )
    return actions


def _iam_statement(action: str) -> str:
    """Which IAM statement an iam: action belongs to: roles by tag, policies and profiles by name, OIDC providers."""
    verb = action.split(":", 1)[1]
    if verb == "PassRole":
        return "PassStackRoles"
    if verb == "CreateServiceLinkedRole":
        return "ServiceLinkedRoles"
    if verb == "CreateRole":
        return "CreateTaggedRoles"
    if action in BOUNDED_ROLE_WRITES:
        return "WriteBoundedRolePolicies"
    if "OpenIDConnectProvider" in verb:
        return "ClusterOidcProvider"
    if "InstanceProfile" in verb and verb != "ListInstanceProfilesForRole":
        return "NamedInstanceProfiles"
    if "Policy" in verb and "Role" not in verb:
        return "NamedPolicies"
    return "ManageTaggedRoles"


def statement_for(action: str) -> str:
    """The Sid of the statement that grants `action`."""
    service, verb = action.split(":", 1)
    if action in ANYWHERE or verb.startswith(("Describe", "List")) or service in UNSCOPED:
        return "Anywhere"
    if service == "iam":
        return _iam_statement(action)
    if service == "kms":
        if verb == "CreateKey":
            return "CreateTaggedKeys"
        return "KeyAliases" if "Alias" in verb else "ManageTaggedKeys"
    if service not in NAMED:
        raise UnknownResourceType(f"{action}: its service has no scope in NAMED, TAGGED or UNSCOPED")
    return f"Named{service.capitalize()}"


def _with_boundary(condition: Mapping[str, Any]) -> dict[str, Any]:
    """`condition` and the permissions boundary on the role (both StringEquals: every key must match)."""
    return {"StringEquals": {**condition["StringEquals"], **REQUIRE_BOUNDARY["StringEquals"]}}


# Denies that hold whatever the Allow statements grant: a role's boundary cannot be removed, nor the boundary
# policy created, changed or deleted by the deployer (docs/deploy.md: an administrator creates it once).
BOUNDARY_DENIES: tuple[dict[str, Any], ...] = (
    {"Sid": "DenyBoundaryRemoval", "Effect": "Deny", "Action": ["iam:DeleteRolePermissionsBoundary"], "Resource": "*"},
    {"Sid": "DenyBoundaryPolicyWrites", "Effect": "Deny", "Action": list(BOUNDARY_WRITES), "Resource": BOUNDARY_POLICY},
)


def _resources_and_condition(sid: str) -> tuple[list[str] | str, dict[str, Any] | None]:
    fixed: dict[str, tuple[list[str] | str, dict[str, Any] | None]] = {
        "Anywhere": ("*", None),
        "CreateTaggedRoles": (list(TAGGED["iam"]), _with_boundary(REQUEST_PROJECT)),
        "WriteBoundedRolePolicies": (list(TAGGED["iam"]), _with_boundary(TAGGED_PROJECT)),
        "ManageTaggedRoles": (list(TAGGED["iam"]), dict(TAGGED_PROJECT)),
        "PassStackRoles": (
            list(TAGGED["iam"]),
            # iam:PassedToService is single-valued: StringEquals, not ForAllValues (which a missing key satisfies).
            {"StringEquals": {f"aws:ResourceTag/{PROJECT_TAG}": PROJECT, "iam:PassedToService": list(PASSED_TO)}},
        ),
        "ServiceLinkedRoles": (
            "arn:aws:iam::*:role/aws-service-role/*",
            {"StringEquals": {"iam:AWSServiceName": list(SERVICE_LINKED)}},
        ),
        "ClusterOidcProvider": ("arn:aws:iam::*:oidc-provider/oidc.eks.*", None),
        "NamedInstanceProfiles": (f"arn:aws:iam::*:instance-profile/{PREFIX}*", None),
        "NamedPolicies": (f"arn:aws:iam::*:policy/{PREFIX}*", None),
        "CreateTaggedKeys": ("*", dict(REQUEST_PROJECT)),
        "ManageTaggedKeys": (list(TAGGED["kms"]), dict(TAGGED_PROJECT)),
        # An alias call names both the alias and its key; the key carries no tag condition here because the
        # alias, which the same condition would be tested against, has no tags.
        "KeyAliases": ([f"arn:aws:kms:*:*:alias/{PREFIX.rstrip('-')}*", *TAGGED["kms"]], None),
    }
    if sid in fixed:
        return fixed[sid]
    service = sid.removeprefix("Named").lower()
    return list(NAMED[service]), None


def policy_document(actions: Iterable[str]) -> dict[str, Any]:
    grouped: dict[str, set[str]] = {}
    for action in set(actions):
        grouped.setdefault(statement_for(action), set()).add(action)
    statements = []
    for sid in sorted(grouped):
        resources, condition = _resources_and_condition(sid)
        statement: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": sorted(grouped[sid])}
        statement["Resource"] = resources
        if condition:
            statement["Condition"] = condition
        statements.append(statement)
    return {"Version": "2012-10-17", "Statement": [*statements, *(dict(deny) for deny in BOUNDARY_DENIES)]}


def plan_types(plans: Sequence[Sequence[Mapping[str, Any]]]) -> set[str]:
    return {str(item["type"]) for plan in plans for item in plan}


def document_for(plans: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    return policy_document(actions_for(plan_types(plans)))


def missing_actions(document: Mapping[str, Any], types: Iterable[str]) -> dict[str, set[str]]:
    """Type -> the actions it needs (`ACTIONS`) that no Allow statement of `document` names, wildcards expanded."""
    granted = [
        pattern.lower()
        for statement in document["Statement"]
        if statement["Effect"] == "Allow"
        for pattern in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    ]
    missing: dict[str, set[str]] = {}
    for type_token in types:
        lacking = {action for action in actions_for([type_token]) if not _granted(action, granted)}
        if lacking:
            missing[type_token] = lacking
    return missing


def _granted(action: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(action.lower(), pattern) for pattern in patterns)


def render(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def policy_size(document: Mapping[str, Any]) -> int:
    """The size IAM counts against a managed policy's limit: the document without whitespace."""
    return len(json.dumps(document, separators=(",", ":")))


def parts(document: Mapping[str, Any], limit: int = MANAGED_POLICY_LIMIT) -> list[dict[str, Any]]:
    """The document's statements, in order, packed into as few managed policies of at most `limit` as that allows.

    The whole document is larger than one managed policy may be, so the deploying role takes it as these parts.
    """
    packed: list[dict[str, Any]] = []
    for statement in document["Statement"]:
        alone = {"Version": document["Version"], "Statement": [statement]}
        if policy_size(alone) > limit:
            raise ValueError(f"statement {statement['Sid']} alone is over the {limit}-character managed policy limit")
        if packed and policy_size({**packed[-1], "Statement": [*packed[-1]["Statement"], statement]}) <= limit:
            packed[-1]["Statement"].append(statement)
        else:
            packed.append(alone)
    return packed


def part_path(index: int) -> Path:
    return DOCUMENT.with_name(f"{DOCUMENT.stem}-part-{index}.json")


def outputs(plans: Sequence[Sequence[Mapping[str, Any]]]) -> dict[Path, str]:
    """Each file the command writes -> its text: the whole document (to review) and its parts (to attach)."""
    document = document_for(plans)
    files = {DOCUMENT: render(document)}
    files.update({part_path(index): render(part) for index, part in enumerate(parts(document), start=1)})
    files[BOUNDARY_DOCUMENT] = render(boundary_document())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.ops.deployer_policy", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated document is stale")
    args = parser.parse_args(argv)
    from infra.ops.plan_capture import capture_plan

    plans = [capture_plan(stack) for stack in STACKS]
    plans += [capture_plan(stack, overrides) for stack, overrides in OPT_IN.items()]
    files = outputs(plans)
    leftover = set(DOCUMENT.parent.glob(f"{DOCUMENT.stem}-part-*.json")) - set(files)
    if args.check:
        stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
        for path in [*stale, *sorted(leftover)]:
            print(f"{path.relative_to(ROOT)} is stale: run python -m infra.ops.deployer_policy", file=sys.stderr)
        return 1 if stale or leftover else 0
    for path in leftover:
        path.unlink()
    for path, text in files.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
