"""Plan check `egress-path`: every route to the internet (0.0.0.0/0) goes a way that admits nothing back in.

Each route is read, in a route table's inline `routes` or as an `aws:ec2/route:Route`, and must go:
- to an internet gateway only from subnets whose machines no one outside the VPC can reach: a node's security
  groups (through its Auto Scaling group's launch template, or an instance's own) have no inbound rule at all
  (the small tier's node, `network.egress: public_subnets`); a NAT instance there admits TCP 443 from the VPC
  only; an EKS managed node group is refused there (its nodes share the cluster group, which takes inbound);
- to a NAT gateway (`network.egress: nat_gateway`): managed, forwards what the nodes' groups send (`sg-egress`
  holds them to TCP 443);
- to a NAT instance of this plan (infra/components/nat_instance.py): its groups admit TCP 443 from the VPC only and
  send TCP 443 only; IMDSv2 at hop limit 1, no SSH key, an encrypted root volume: the one machine with a public
  address all month. Every plain EC2 instance in the plan is held to the same.
Any other target (a peering, a transit gateway, an interface this plan does not own) is refused: nothing here
knows where it leads. Every stack's plan has at least the public route table's default route.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any

from infra.rules.checks_egress import Network, egress_problems, vpc_networks
from infra.rules.plan_view import Plan, Resource, Rule, Violation, as_list, label, of_type, require_matches

NAME = "egress-path"
ANYWHERE = "0.0.0.0/0"
HTTPS = 443
_TCP = {"tcp", "6", "6.0"}
INSTANCE = "aws:ec2/instance:Instance"
NODE_GROUP_TYPES = ("eks:index:ManagedNodeGroup", "aws:eks/nodeGroup:NodeGroup")


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def _default_routes(plan: Plan) -> Iterator[tuple[Resource, str, Mapping[str, Any]]]:
    """(where it is declared, its route table's id, the route) for every route to 0.0.0.0/0."""
    for table in of_type(plan, "aws:ec2/routeTable:RouteTable"):
        for route in as_list(table["inputs"].get("routes")):
            if route.get("cidrBlock") == ANYWHERE:
                yield table, str(table.get("id")), route
    for item in of_type(plan, "aws:ec2/route:Route"):
        if item["inputs"].get("destinationCidrBlock") == ANYWHERE:
            yield item, str(item["inputs"].get("routeTableId")), item["inputs"]


def ingress_of(plan: Plan, group_id: str) -> list[dict[str, Any]]:
    """Every inbound rule of one security group, however declared: {protocol, from, to, cidrs, other}."""
    rules: list[dict[str, Any]] = []
    for group in of_type(plan, "aws:ec2/securityGroup:SecurityGroup"):
        if str(group.get("id")) == group_id:
            for rule in as_list(group["inputs"].get("ingress")):
                rules.append(
                    {
                        "protocol": rule.get("protocol"),
                        "from": rule.get("fromPort"),
                        "to": rule.get("toPort"),
                        "cidrs": [*as_list(rule.get("cidrBlocks")), *as_list(rule.get("ipv6CidrBlocks"))],
                        "other": [*as_list(rule.get("securityGroups")), *as_list(rule.get("prefixListIds"))],
                    }
                )
    for item in of_type(plan, "aws:ec2/securityGroupRule:SecurityGroupRule"):
        inputs = item["inputs"]
        if inputs.get("type") == "ingress" and str(inputs.get("securityGroupId")) == group_id:
            rules.append(
                {
                    "protocol": inputs.get("protocol"),
                    "from": inputs.get("fromPort"),
                    "to": inputs.get("toPort"),
                    "cidrs": [*as_list(inputs.get("cidrBlocks")), *as_list(inputs.get("ipv6CidrBlocks"))],
                    "other": [*as_list(inputs.get("sourceSecurityGroupId")), *as_list(inputs.get("prefixListIds"))],
                }
            )
    for item in of_type(plan, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        inputs = item["inputs"]
        if str(inputs.get("securityGroupId")) == group_id:
            rules.append(
                {
                    "protocol": inputs.get("ipProtocol"),
                    "from": inputs.get("fromPort"),
                    "to": inputs.get("toPort"),
                    "cidrs": [*as_list(inputs.get("cidrIpv4")), *as_list(inputs.get("cidrIpv6"))],
                    "other": [*as_list(inputs.get("referencedSecurityGroupId")), *as_list(inputs.get("prefixListId"))],
                }
            )
    return rules


def _inside(cidr: Any, vpc: list[Network]) -> bool:
    network = ipaddress.ip_network(str(cidr), strict=False)
    return any(network.version == own.version and network.subnet_of(own) for own in vpc)  # type: ignore[arg-type]


def _https_from_vpc_only(rules: list[dict[str, Any]], vpc: list[Network]) -> list[str]:
    problems = []
    for rule in rules:
        https = str(rule["protocol"]).lower() in _TCP and rule["from"] is not None and rule["to"] is not None
        https = https and int(float(rule["from"])) == HTTPS and int(float(rule["to"])) == HTTPS
        outside = [str(cidr) for cidr in rule["cidrs"] if not _inside(cidr, vpc)]
        if outside or rule["other"] or not https:
            problems.append(
                f"inbound {rule['protocol']} {rule['from']}-{rule['to']} from {rule['cidrs'] + rule['other']}"
            )
    return problems


def instance_problems(plan: Plan, instance: Resource, vpc: list[Network]) -> list[str]:
    """What lets a NAT instance be reached, leak its role's credentials or its disk, or forward more than HTTPS."""
    inputs = instance["inputs"]
    metadata = inputs.get("metadataOptions") or {}
    problems = []
    if metadata.get("httpTokens") != "required":
        problems.append("IMDSv1 allowed: set metadataOptions.httpTokens required")
    hop = metadata.get("httpPutResponseHopLimit")
    if hop is None or float(hop) != 1:
        problems.append(f"IMDS hop limit {hop}: set it to 1")
    if inputs.get("keyName"):
        problems.append("an SSH key pair: nothing logs in to it")
    if not _truthy((inputs.get("rootBlockDevice") or {}).get("encrypted")):
        problems.append("root volume not encrypted")
    groups = [str(group) for group in as_list(inputs.get("vpcSecurityGroupIds"))]
    if not groups:
        problems.append("no security group of this plan: the VPC's default group would apply")
    for group in groups:
        problems += [
            f"{group}: {problem}: only TCP 443 from the VPC"
            for problem in _https_from_vpc_only(ingress_of(plan, group), vpc)
        ]
        for item in of_type(plan, "aws:ec2/securityGroup:SecurityGroup"):
            if str(item.get("id")) == group:
                for rule in as_list(item["inputs"].get("egress")):
                    shaped = {
                        "protocol": rule.get("protocol"),
                        "from": rule.get("fromPort"),
                        "to": rule.get("toPort"),
                        "cidrs": as_list(rule.get("cidrBlocks")),
                        "prefix_lists": as_list(rule.get("prefixListIds")),
                    }
                    problems += [f"{group}: {problem}" for problem in egress_problems(shaped, vpc)]
    return problems


def _launch_template_groups(plan: Plan, group: Resource) -> list[str]:
    """The security groups an Auto Scaling group's instances get from their launch template."""
    inputs = group["inputs"]
    spec = (inputs.get("mixedInstancesPolicy") or {}).get("launchTemplate", {}).get("launchTemplateSpecification")
    spec = spec or inputs.get("launchTemplate") or {}
    template_id = str(spec.get("launchTemplateId") or spec.get("id"))
    groups: list[str] = []
    for template in of_type(plan, "aws:ec2/launchTemplate:LaunchTemplate"):
        if str(template.get("id")) == template_id:
            groups += [str(g) for g in as_list(template["inputs"].get("vpcSecurityGroupIds"))]
            for interface in as_list(template["inputs"].get("networkInterfaces")):
                groups += [str(g) for g in as_list(interface.get("securityGroups"))]
    return groups


def _public_subnet_problems(plan: Plan, subnets: set[str], vpc: list[Network]) -> list[tuple[Resource, str]]:
    """What in subnets routed to the internet gateway someone outside the VPC could reach."""
    found: list[tuple[Resource, str]] = []
    for group in of_type(plan, "aws:autoscaling/group:Group"):
        if subnets & {str(s) for s in as_list(group["inputs"].get("vpcZoneIdentifiers"))}:
            security_groups = _launch_template_groups(plan, group)
            if not security_groups:
                found.append((group, "in a subnet routed to the internet gateway without a security group of its own"))
            for security_group in security_groups:
                for rule in ingress_of(plan, security_group):
                    reach = f"{rule['protocol']} {rule['from']}-{rule['to']}"
                    found.append(
                        (
                            group,
                            f"in a subnet routed to the internet gateway, {security_group} takes inbound "
                            f"{reach}: a public node takes none",
                        )
                    )
    for node_group in (item for item in plan if item["type"] in NODE_GROUP_TYPES):  # remote: not of_type
        if subnets & {str(s) for s in as_list(node_group["inputs"].get("subnetIds"))}:
            found.append((node_group, "an EKS node group in a subnet routed to the internet gateway: keep it private"))
    return found


def check_egress_path(plan: Plan) -> list[Violation]:
    vpc = vpc_networks(plan)
    routes = list(_default_routes(plan))
    require_matches(NAME, len(routes), "route to 0.0.0.0/0")
    instances = of_type(plan, INSTANCE)
    interfaces = {str((item.get("outputs") or {}).get("primaryNetworkInterfaceId")): item for item in instances}
    by_id = {str(item.get("id")): item for item in instances}
    associations = of_type(plan, "aws:ec2/routeTableAssociation:RouteTableAssociation")
    violations = [
        Violation(NAME, label(item), problem) for item in instances for problem in instance_problems(plan, item, vpc)
    ]
    for where, table_id, route in routes:
        if route.get("gatewayId"):
            subnets = {
                str(a["inputs"].get("subnetId"))
                for a in associations
                if str(a["inputs"].get("routeTableId")) == table_id
            }
            violations += [
                Violation(NAME, label(item), problem) for item, problem in _public_subnet_problems(plan, subnets, vpc)
            ]
            violations += [
                Violation(NAME, label(item), f"in a subnet routed to the internet gateway: {problem}")
                for item in instances
                if str(item["inputs"].get("subnetId")) in subnets
                for problem in instance_problems(plan, item, vpc)
            ]
        elif route.get("natGatewayId"):
            continue
        elif route.get("networkInterfaceId") or route.get("instanceId"):
            target = interfaces.get(str(route.get("networkInterfaceId"))) or by_id.get(str(route.get("instanceId")))
            if target is None:
                violations.append(
                    Violation(
                        NAME,
                        label(where),
                        f"default route to {route.get('networkInterfaceId') or route.get('instanceId')}, "
                        "not a NAT instance of this plan",
                    )
                )
        else:
            target_keys = sorted(key for key, value in route.items() if value and key != "cidrBlock")
            violations.append(
                Violation(NAME, label(where), f"default route via {target_keys}: not a NAT or internet gateway")
            )
    # A violation found twice (an instance both in the plan and in a public subnet) is one problem.
    unique: dict[tuple[str, str], Violation] = {}
    for violation in violations:
        unique.setdefault(
            (violation.resource, violation.problem.removeprefix("in a subnet routed to the internet gateway: ")),
            violation,
        )
    return list(unique.values())


RULES: dict[str, Rule] = {
    NAME: Rule(
        check_egress_path,
        "route 0.0.0.0/0 through a NAT gateway or a NAT instance (TCP 443 from the VPC only, IMDSv2, no key, "
        "encrypted root), or through the internet gateway only from subnets whose nodes take no inbound "
        "(infra/components/network.py)",
    ),
}
