"""Plan checks on network reach and on what each kind of storage resource gets.

- `eks-endpoint`: a public EKS API endpoint lists CIDRs, and no set of them that together covers the
  internet (or a block wider than /16): with no list AWS opens it to 0.0.0.0/0.
- `node-metadata`: nodes of an EKS cluster (managed node group launch templates, Karpenter EC2NodeClasses)
  keep the IMDS hop limit at 1, so a pod cannot reach the node role's credentials through the metadata
  service. The small tier's single node runs the job in a container that needs its instance role (hop 2).
- `bucket-types`: every resource type that creates an S3 bucket is one the `buckets` check knows;
  a bucket declared another way would escape encryption, public-access and TLS checks.
- `endpoint-policies`: the S3 gateway endpoint every stack has serves every route table its nodes' subnets use
  (models, data and ECR's layers stay off the NAT and the internet gateway), and every interface VPC endpoint
  (none by default: docs/cost.md) has a policy whose every Allow is pinned to this account (aws:PrincipalAccount
  or aws:ResourceAccount), so another account's credentials cannot use it to move data. The gateway endpoint
  keeps S3's default policy: ECR's layers and the OS packages are in buckets of AWS's own accounts.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from infra.rules.checks_iam import own_account
from infra.rules.plan_view import (
    CLUSTER_TIERS,
    Plan,
    Rule,
    Violation,
    allow_statements,
    as_json,
    as_list,
    is_node_class,
    label,
    of_type,
    refers_to,
    require_matches,
)

CLUSTER_TYPES = ("eks:index:Cluster", "aws:eks/cluster:Cluster")
NODE_GROUP_TYPES = ("eks:index:ManagedNodeGroup", "aws:eks/nodeGroup:NodeGroup")
WIDEST_PREFIX = 16
# Every type token that creates a bucket; `buckets` (infra/rules/registry.py) checks each of these kinds.
BUCKET_TYPES = (
    "aws:s3/bucket:Bucket",
    "aws:s3/bucketV2:BucketV2",
    "aws:s3control/bucket:Bucket",
    "aws:s3/directoryBucket:DirectoryBucket",
    "aws:s3tables/tableBucket:TableBucket",
    "aws-native:s3:Bucket",
    "aws-native:s3express:DirectoryBucket",
)
CHECKED_BUCKET_TYPES = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def endpoint_problems(inputs: dict[str, Any]) -> list[str]:
    """What makes a cluster's API endpoint reachable from the internet."""
    config = inputs.get("vpcConfig") or {}
    public = inputs.get("endpointPublicAccess", config.get("endpointPublicAccess", True))
    if not _truthy(public):
        return []
    cidrs = as_list(inputs.get("publicAccessCidrs") or config.get("publicAccessCidrs"))
    if not cidrs:
        return ["public endpoint with no CIDR list: AWS opens it to 0.0.0.0/0"]
    networks = [ipaddress.ip_network(str(cidr), strict=False) for cidr in cidrs]
    wide = [str(net) for net in networks if net.prefixlen < WIDEST_PREFIX]
    v4 = list(ipaddress.collapse_addresses(net for net in networks if net.version == 4))
    if v4 == [ipaddress.ip_network("0.0.0.0/0")]:
        return [f"public endpoint CIDRs {cidrs} together cover the whole internet"]
    if wide:
        return [f"public endpoint CIDRs {wide} are wider than /{WIDEST_PREFIX}"]
    return []


ACCOUNT_KEYS = ("aws:PrincipalAccount", "aws:ResourceAccount")
_ACCOUNT_ID = re.compile(r"^\d{12}$")


def endpoint_policy_problems(policy: Any, account: str | None) -> list[str]:
    """What lets an interface endpoint carry requests beyond this account's principals or resources."""
    if not policy:
        return ["no endpoint policy: the default allows any principal of any account"]
    problems = []
    for statement in allow_statements(as_json(policy)):
        pinned = {
            key: as_list(values)
            for operator, block in (statement.get("Condition") or {}).items()
            if operator in ("StringEquals", "ForAnyValue:StringEquals")
            for key, values in block.items()
            if key in ACCOUNT_KEYS
        }
        if not pinned:
            problems.append(f"statement {statement.get('Sid', '')!r} is not limited by {' or '.join(ACCOUNT_KEYS)}")
            continue
        for key, values in pinned.items():
            strange = [str(value) for value in values if not _ACCOUNT_ID.match(str(value)) or str(value) != account]
            if account is not None and strange:
                problems.append(f"{key} admits {strange}, not this account ({account})")
    return problems


def check_endpoint_policies(plan: Plan) -> list[Violation]:
    name = "endpoint-policies"
    endpoints = [
        item
        for item in of_type(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")
        if item["inputs"].get("vpcEndpointType") == "Interface"
    ]
    gateways = [
        item
        for item in of_type(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")
        if item["inputs"].get("vpcEndpointType") == "Gateway" and str(item["inputs"].get("serviceName")).endswith(".s3")
    ]
    require_matches(name, len(gateways), "S3 gateway endpoint")
    account = own_account(plan)
    violations = [
        Violation(name, label(item), problem)
        for item in endpoints
        for problem in endpoint_policy_problems(item["inputs"].get("policy"), account)
    ]
    served = {str(table) for item in gateways for table in as_list(item["inputs"].get("routeTableIds"))}
    for table_id, node in sorted(node_route_tables(plan).items()):
        if table_id not in served:
            violations.append(
                Violation(name, label(node), f"its subnets' route table {table_id} has no S3 gateway endpoint")
            )
    return violations


def node_route_tables(plan: Plan) -> dict[str, Any]:
    """Route table id -> one node group or Auto Scaling group whose subnets it routes."""
    subnets: dict[str, Any] = {}
    for item in (item for item in plan if item["type"] in NODE_GROUP_TYPES):  # remote components: not of_type
        subnets.update({str(subnet): item for subnet in as_list(item["inputs"].get("subnetIds"))})
    for item in of_type(plan, "aws:autoscaling/group:Group"):
        subnets.update({str(subnet): item for subnet in as_list(item["inputs"].get("vpcZoneIdentifiers"))})
    return {
        str(association["inputs"].get("routeTableId")): subnets[str(association["inputs"].get("subnetId"))]
        for association in of_type(plan, "aws:ec2/routeTableAssociation:RouteTableAssociation")
        if str(association["inputs"].get("subnetId")) in subnets
    }


def check_eks_endpoint(plan: Plan) -> list[Violation]:
    name = "eks-endpoint"
    clusters = [item for item in plan if item["type"] in CLUSTER_TYPES]
    violations = [
        Violation(name, label(item), problem) for item in clusters for problem in endpoint_problems(item["inputs"])
    ]
    require_matches(name, len(clusters), "EKS cluster")
    return violations


def check_node_metadata(plan: Plan) -> list[Violation]:
    name = "node-metadata"
    violations: list[Violation] = []
    templates = of_type(plan, "aws:ec2/launchTemplate:LaunchTemplate")
    matched = 0
    for group in (item for item in plan if item["type"] in NODE_GROUP_TYPES):
        matched += 1
        template = next(
            (t for t in templates if refers_to(group, "launchTemplate", t, lambda spec: (spec or {}).get("id"))), None
        )
        if template is None:
            violations.append(Violation(name, label(group), "no launch template of this plan: IMDS left at defaults"))
            continue
        hop = (template["inputs"].get("metadataOptions") or {}).get("httpPutResponseHopLimit")
        if hop is None or float(hop) != 1:
            violations.append(
                Violation(name, label(template), f"IMDS hop limit {hop} on EKS nodes: pods reach the node role")
            )
    for item in plan:
        if item.get("custom") and is_node_class(item["type"]):
            matched += 1
            hop = ((item["inputs"].get("spec") or {}).get("metadataOptions") or {}).get("httpPutResponseHopLimit")
            if hop is None or float(hop) != 1:
                violations.append(
                    Violation(name, label(item), f"IMDS hop limit {hop} on EKS nodes: pods reach the node role")
                )
    require_matches(name, matched, "EKS node group or EC2NodeClass")
    return violations


def check_bucket_types(plan: Plan) -> list[Violation]:
    name = "bucket-types"
    buckets = [item for item in plan if item["type"] in BUCKET_TYPES]
    violations = [
        Violation(name, label(item), "a bucket type the bucket checks do not cover (encryption, public access, TLS)")
        for item in buckets
        if item["type"] not in CHECKED_BUCKET_TYPES
    ]
    require_matches(name, len(buckets), "S3 bucket of any type")
    return violations


RULES: dict[str, Rule] = {
    "eks-endpoint": Rule(
        check_eks_endpoint,
        "keep the endpoint private, or list deployers' CIDRs (/16 or narrower) in eks.endpoint_public_access_cidrs",
        CLUSTER_TIERS,
    ),
    "node-metadata": Rule(
        check_node_metadata, "set metadataOptions.httpPutResponseHopLimit to 1 on EKS nodes", CLUSTER_TIERS
    ),
    "bucket-types": Rule(check_bucket_types, "declare buckets with aws.s3.Bucket (the DataBucket component)"),
    "endpoint-policies": Rule(
        check_endpoint_policies,
        "attach the S3 gateway endpoint to the nodes' route tables; give each interface endpoint a policy pinned "
        "to this account (infra/components/network.py endpoint_policy)",
    ),
}
