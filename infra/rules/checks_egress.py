"""Plan check `sg-egress`: no security group lets traffic out wider than the project's own groups do.

The project's groups send HTTPS only (TCP 443) beyond the VPC: AWS APIs, ECR and the model hub. Inside the
VPC (its CIDRs, another security group, the group itself) any port is allowed: what may arrive there is the
receiving group's ingress, which `security-groups` and the groups' own rules bound. Every way of writing an
egress rule is read, whoever adds it: a group's inline `egress`, `aws:ec2/securityGroupRule` of type egress,
and `aws:vpc/securityGroupEgressRule`. A prefix list (an AWS service's ranges) counts as beyond the VPC.

Refused: all protocols or all ports to the internet, any port but 443, UDP 443, a CIDR outside the VPC on
another port. The EKS cluster's own security group is made by the pulumi-eks component and is not in the plan.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any

from infra.rules.plan_view import Plan, Resource, Rule, Violation, as_list, label, of_type, require_matches

NAME = "sg-egress"
GROUP_TYPES = ("aws:ec2/securityGroup:SecurityGroup", "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
LEGACY_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
EGRESS_TYPES = (*GROUP_TYPES, LEGACY_RULE, EGRESS_RULE)
HTTPS = 443
_ALL = {"-1", "all", "-1.0"}
_TCP = {"tcp", "6", "6.0"}
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def vpc_networks(plan: Plan) -> list[Network]:
    """The CIDRs of the plan's VPCs (their primary block and any associated one)."""
    types = ("aws:ec2/vpc:Vpc", "aws:ec2/vpcIpv4CidrBlockAssociation:VpcIpv4CidrBlockAssociation")
    blocks = [item["inputs"].get("cidrBlock") for item in of_type(plan, *types)]
    return [ipaddress.ip_network(str(block), strict=False) for block in blocks if block]


def _port(value: Any) -> int | None:
    return None if value is None else int(float(value))


def _only_https(protocol: Any, from_port: Any, to_port: Any) -> bool:
    return str(protocol).lower() in _TCP and _port(from_port) == HTTPS and _port(to_port) == HTTPS


def _egress_of(item: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, rule in one shape) for every egress rule a resource declares:
    {protocol, from, to, cidrs, prefix_lists, groups}."""
    inputs = item["inputs"]
    if item["type"] in GROUP_TYPES:
        for index, rule in enumerate(as_list(inputs.get("egress"))):
            yield (
                f"egress[{index}]",
                {
                    "protocol": rule.get("protocol"),
                    "from": rule.get("fromPort"),
                    "to": rule.get("toPort"),
                    "cidrs": [*as_list(rule.get("cidrBlocks")), *as_list(rule.get("ipv6CidrBlocks"))],
                    "prefix_lists": as_list(rule.get("prefixListIds")),
                    "groups": [*as_list(rule.get("securityGroups")), *(["self"] if rule.get("self") else [])],
                },
            )
    elif item["type"] == LEGACY_RULE and inputs.get("type") == "egress":
        yield (
            "rule",
            {
                "protocol": inputs.get("protocol"),
                "from": inputs.get("fromPort"),
                "to": inputs.get("toPort"),
                "cidrs": [*as_list(inputs.get("cidrBlocks")), *as_list(inputs.get("ipv6CidrBlocks"))],
                "prefix_lists": as_list(inputs.get("prefixListIds")),
                "groups": [*as_list(inputs.get("sourceSecurityGroupId")), *(["self"] if inputs.get("self") else [])],
            },
        )
    elif item["type"] == EGRESS_RULE:
        yield (
            "rule",
            {
                "protocol": inputs.get("ipProtocol"),
                "from": inputs.get("fromPort"),
                "to": inputs.get("toPort"),
                "cidrs": [*as_list(inputs.get("cidrIpv4")), *as_list(inputs.get("cidrIpv6"))],
                "prefix_lists": as_list(inputs.get("prefixListId")),
                "groups": as_list(inputs.get("referencedSecurityGroupId")),
            },
        )


def egress_problems(rule: Mapping[str, Any], vpc: list[Network]) -> list[str]:
    """What in one egress rule reaches beyond the VPC on more than TCP 443."""
    if _only_https(rule["protocol"], rule["from"], rule["to"]):
        return []
    outside = []
    for cidr in rule["cidrs"]:
        network = ipaddress.ip_network(str(cidr), strict=False)
        if not any(network.version == own.version and network.subnet_of(own) for own in vpc):  # type: ignore[arg-type]
            outside.append(str(cidr))
    outside += [f"prefix list {prefix}" for prefix in rule["prefix_lists"]]
    if not outside:
        return []
    if str(rule["protocol"]).lower() in _ALL:
        reach = "every protocol and port"
    else:
        reach = f"{rule['protocol']} {_port(rule['from'])}-{_port(rule['to'])}"
    return [f"egress to {outside} on {reach}: beyond the VPC only TCP 443 goes out"]


def check_sg_egress(plan: Plan) -> list[Violation]:
    vpc = vpc_networks(plan)
    resources = of_type(plan, *EGRESS_TYPES)
    violations = [
        Violation(NAME, label(item), f"{where}: {problem}")
        for item in resources
        for where, rule in _egress_of(item)
        for problem in egress_problems(rule, vpc)
    ]
    require_matches(NAME, len(resources), "security group or egress rule")
    return violations


RULES: dict[str, Rule] = {
    NAME: Rule(
        check_sg_egress,
        "send only TCP 443 beyond the VPC (VPC CIDRs and security groups may take other ports)",
    ),
}
