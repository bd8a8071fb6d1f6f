"""The IAM policy the identity that runs `pulumi up` needs, derived from what the three plans create.

    python -m infra.ops.deployer_policy            # rewrites docs/deployer-policy.json from the plans
    python -m infra.ops.deployer_policy --check    # exit 1 when the committed document is stale

Each resource type maps to the IAM service prefixes that create, update and delete it; remote components
(pulumi-eks' Cluster and ManagedNodeGroup, the image build) whose inner resources a plan never shows map to
the services those inner resources use. The document grants each such service, and nothing else: a deployer
must create and delete what the program declares, so it is a power user of exactly these services. Identity
is the sharp edge: `iam:*` lets the deployer create roles, so an organisation that needs more attach a
permissions boundary to the deploying role (docs/deploy.md). A type the table does not know fails the check,
naming the type, so a new resource type cannot ship without its permission.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.ops.stacks import ROOT

DOCUMENT = ROOT / "docs" / "deployer-policy.json"
STACKS = ("small", "medium", "large")
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

# Provider module of a type token (`aws:<module>/<resource>:<Name>`) -> the IAM prefixes that manage it.
AWS_MODULE_SERVICES: Mapping[str, tuple[str, ...]] = {
    "apigatewayv2": ("apigateway",),  # HTTP APIs, routes, integrations, stages: apigateway:* on /apis/...
    "autoscaling": ("autoscaling",),
    "budgets": ("budgets",),
    "cloudwatch": ("cloudwatch", "logs", "events"),  # alarms and dashboards, log groups, EventBridge rules
    "costexplorer": ("ce",),
    "ec2": ("ec2",),
    "ecr": ("ecr",),
    "eks": ("eks",),
    "iam": ("iam",),
    "kms": ("kms",),
    "lambda": ("lambda",),
    "s3": ("s3",),
    "scheduler": ("scheduler",),
    "secretsmanager": ("secretsmanager",),
    "sfn": ("states",),
    "sns": ("sns",),
    "sqs": ("sqs",),
    "vpc": ("ec2",),  # VPC endpoint policies and the like live under EC2's API
}
# Remote components and other providers' resources: the AWS services their inner resources or calls use.
COMPONENT_SERVICES: Mapping[str, tuple[str, ...]] = {
    # pulumi-eks: the cluster, its security groups, OIDC provider, IAM roles, secrets-encryption key grants.
    "eks:index:Cluster": ("eks", "ec2", "iam", "kms", "ssm"),
    "eks:index:ManagedNodeGroup": ("eks", "ec2", "iam", "autoscaling"),
    "docker-build:index:Image": ("ecr",),  # pushes to the stack's repository
}
# Read-only look-ups the program makes (caller identity, region, SSM GPU AMI parameter, route tables).
LOOKUPS: tuple[str, ...] = ("sts:GetCallerIdentity", "ssm:GetParameter", "ec2:Describe*", "iam:GetRole")
# Types that create nothing in AWS: Kubernetes objects (the cluster's API), providers, components.
NOT_AWS_PREFIXES = ("kubernetes:", "pulumi:", "llmbatch:")


class UnknownResourceType(ValueError):
    """A type in a plan that no entry of the tables covers."""


def services_for(types: Iterable[str]) -> set[str]:
    """The IAM service prefixes the given resource types need; UnknownResourceType names any type not covered."""
    services: set[str] = set()
    unknown = []
    for type_token in types:
        if type_token.startswith(NOT_AWS_PREFIXES):
            continue
        if type_token in COMPONENT_SERVICES:
            services.update(COMPONENT_SERVICES[type_token])
            continue
        provider, _, rest = type_token.partition(":")
        module = rest.split("/", 1)[0]
        if provider == "aws" and module in AWS_MODULE_SERVICES:
            services.update(AWS_MODULE_SERVICES[module])
        else:
            unknown.append(type_token)
    if unknown:
        raise UnknownResourceType(
            f"no deployer permission known for {sorted(set(unknown))}: add its module to AWS_MODULE_SERVICES or "
            "COMPONENT_SERVICES in infra/ops/deployer_policy.py"
        )
    return services


def policy_document(services: Iterable[str]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ManageWhatThePlansCreate",
                "Effect": "Allow",
                "Action": sorted(f"{service}:*" for service in set(services)),
                "Resource": "*",
            },
            {"Sid": "LookUps", "Effect": "Allow", "Action": sorted(LOOKUPS), "Resource": "*"},
        ],
    }


def plan_types(plans: Sequence[Sequence[Mapping[str, Any]]]) -> set[str]:
    return {str(item["type"]) for plan in plans for item in plan}


def document_for(plans: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    return policy_document(services_for(plan_types(plans)))


def render(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.ops.deployer_policy", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/deployer-policy.json is stale")
    args = parser.parse_args(argv)
    from infra.ops.plan_capture import capture_plan

    plans = [capture_plan(stack) for stack in STACKS]
    plans += [capture_plan(stack, overrides) for stack, overrides in OPT_IN.items()]
    text = render(document_for(plans))
    if args.check:
        current = DOCUMENT.read_text() if DOCUMENT.is_file() else ""
        if current != text:
            print(f"{DOCUMENT.relative_to(ROOT)} is stale: run python -m infra.ops.deployer_policy", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text)
    print(f"wrote {Path(DOCUMENT).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
