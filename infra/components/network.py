"""The network: a VPC with subnets in two or more zones, or an existing VPC from config.

How the nodes reach HTTPS outside the VPC is `network.egress`: private subnets behind NAT instances (the default,
infra/components/nat_instance.py) or NAT gateways; or, for the small tier's one node, public subnets with no NAT
(the node's security group has no inbound rule and it has a public address only while it runs). Either way the
nodes' route tables get an S3 gateway endpoint, so model downloads, job data and ECR's image layers (the bulk of
the traffic) never leave AWS's network or pay a per-GB charge; interface endpoints come from config.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.nat_instance import nat_instances, nat_security_group
from infra.config import StackConfig
from infra.k8s.karpenter import DISCOVERY_TAG
from infra.zones import choose_zones, offered_by_zone

HTTPS = 443


@dataclass(frozen=True)
class NetworkArgs:
    stack: str
    context: AwsContext
    vpc_cidr: str
    az_count: int
    single_nat_gateway: bool
    interface_endpoints: Sequence[str]
    egress: str = "nat_instance"  # infra/config/sections.py Egress
    nat_instance_type: str = "t4g.nano"
    # The stack key, for the NAT instances' root volumes.
    key_arn: pulumi.Input[str] | None = None
    existing_vpc_id: str | None = None
    existing_private_subnet_ids: Sequence[str] = ()
    # Extra tags on the private subnets, e.g. a Karpenter discovery tag from the EKS component.
    private_subnet_tags: Mapping[str, str] = field(default_factory=dict)
    # Zones must offer every required type and are ranked by the preferred ones they offer (infra/zones.py);
    # none: the first zones by name.
    required_instance_types: Sequence[str] = ()
    preferred_instance_types: Sequence[str] = ()

    @classmethod
    def from_config(
        cls, stack: str, config: StackConfig, context: AwsContext, key_arn: pulumi.Input[str]
    ) -> NetworkArgs:
        network = config.network
        return cls(
            stack=stack,
            context=context,
            vpc_cidr=network.vpc_cidr,
            az_count=network.az_count,
            single_nat_gateway=network.single_nat_gateway,
            interface_endpoints=network.interface_endpoints,
            egress=network.egress,
            nat_instance_type=network.nat_instance_type,
            key_arn=key_arn,
            existing_vpc_id=network.existing_vpc_id,
            existing_private_subnet_ids=network.existing_private_subnet_ids,
            # Karpenter finds the subnets it may use by this tag (on the cluster's name); on subnets the
            # program creates it is theirs.
            private_subnet_tags=(
                {DISCOVERY_TAG: naming.prefix(stack)} if config.tier != "small" and config.eks.karpenter_enabled else {}
            ),
            required_instance_types=config.zone_instance_types[0],
            preferred_instance_types=config.zone_instance_types[1],
        )


# Which of this account's condition keys each interface endpoint's policy pins. sts: IRSA's
# AssumeRoleWithWebIdentity is unauthenticated, so it has no principal account: the role it assumes (the
# resource) must be this account's. ECR: the EKS add-ons' images (vpc-cni, kube-proxy, coredns) live in AWS's own
# registry accounts, so only the caller is pinned. Everything else: the caller, and for logs the log groups too.
_ENDPOINT_KEYS: dict[str, tuple[str, ...]] = {
    "sts": ("aws:ResourceAccount",),
    "logs": ("aws:PrincipalAccount", "aws:ResourceAccount"),
}


def endpoint_policy(service: str, account_id: str) -> str:
    """The interface endpoint's policy: only this account's principals (or, for sts, roles) pass through it, so
    a stolen credential of another account cannot use the VPC's endpoints to move data out."""
    keys = _ENDPOINT_KEYS.get(service, ("aws:PrincipalAccount",))
    statement = {
        "Sid": "ThisAccountOnly",
        "Effect": "Allow",
        "Principal": "*",
        "Action": "*",
        "Resource": "*",
        "Condition": {"StringEquals": {key: account_id for key in keys}},
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def subnet_cidrs(vpc_cidr: str, az_count: int) -> tuple[list[str], list[str]]:
    """Private and public CIDRs: the VPC split in 16; privates from the bottom, publics from the middle up."""
    blocks = list(ipaddress.ip_network(vpc_cidr).subnets(prefixlen_diff=4))
    if az_count > len(blocks) // 2:
        raise ValueError(f"network.az_count {az_count} does not fit in {vpc_cidr}")
    half = len(blocks) // 2
    return [str(block) for block in blocks[:az_count]], [str(block) for block in blocks[half : half + az_count]]


class Network(pulumi.ComponentResource):
    """`vpc_id`, `vpc_cidr`, `private_subnet_ids`, `private_route_table_ids`, `endpoint_security_group_id`.

    `private_subnet_ids` are the subnets the nodes run in: with `egress: public_subnets` (small tier only) the
    public ones, whose route table goes to the internet gateway and to the S3 gateway endpoint."""

    vpc_id: pulumi.Output[str]
    vpc_cidr: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    private_route_table_ids: pulumi.Output[list[str]]
    endpoint_security_group_id: pulumi.Output[str] | None

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:network:Network", name, None, opts)
        self._name = name
        self._args = args
        if args.existing_vpc_id:
            self._use_existing(args.existing_vpc_id, list(args.existing_private_subnet_ids))
        else:
            self._create_vpc()
        self._s3_gateway_endpoint()
        self.endpoint_security_group_id = self._interface_endpoints() if args.interface_endpoints else None
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "private_route_table_ids": self.private_route_table_ids,
            }
        )

    def _child(self, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))

    def _zones(self) -> list[str]:
        """Data sources only, read before any subnet is declared: the same answer makes the same plan."""
        args = self._args
        # Only the region's own zones: Local and Wavelength zones lack most GPU instance types.
        zones = aws.get_availability_zones(
            state="available",
            filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"])],
            opts=pulumi.InvokeOptions(parent=self),
        ).names
        if len(zones) < args.az_count:
            region = args.context.region
            raise ValueError(f"network.az_count is {args.az_count} but {region} has only {len(zones)} zones")
        types = sorted({*args.required_instance_types, *args.preferred_instance_types})
        if not types:
            return sorted(zones)[: args.az_count]
        offerings = aws.ec2.get_instance_type_offerings(
            location_type="availability-zone",
            filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=types)],
            opts=pulumi.InvokeOptions(parent=self),
        )
        offered = offered_by_zone(zip(offerings.instance_types, offerings.locations, strict=True))
        return choose_zones(
            sorted(zones), offered, args.required_instance_types, args.preferred_instance_types, args.az_count
        )

    def _create_vpc(self) -> None:
        args, name = self._args, self._name
        prefix = naming.prefix(args.stack)
        zones = self._zones()
        private_cidrs, public_cidrs = subnet_cidrs(args.vpc_cidr, args.az_count)
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            enable_dns_hostnames=True,  # interface endpoints' private DNS needs both
            enable_dns_support=True,
            tags={"Name": prefix},
            opts=self._child(),
        )
        # The default security group allows all traffic between its members; leave it with no rules at all.
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=vpc.id, opts=self._child())
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={"Name": prefix}, opts=self._child())
        public_table = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=gateway.id)],
            tags={"Name": f"{prefix}-public"},
            opts=self._child(),
        )
        public_subnets = []
        for index, (zone, cidr) in enumerate(zip(zones, public_cidrs, strict=True)):
            subnet = aws.ec2.Subnet(
                f"{name}-public-{index}",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=zone,
                # NATs have their own addresses; with public_subnets the node gets one while it runs.
                map_public_ip_on_launch=args.egress == "public_subnets",
                tags={"Name": f"{prefix}-public-{zone}", "kubernetes.io/role/elb": "1"},
                opts=self._child(),
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{index}",
                subnet_id=subnet.id,
                route_table_id=public_table.id,
                opts=self._child(),
            )
            public_subnets.append(subnet)
        if args.egress == "public_subnets":
            self.vpc_id = vpc.id
            self.vpc_cidr = vpc.cidr_block
            self.private_subnet_ids = pulumi.Output.all(*[subnet.id for subnet in public_subnets])
            self.private_route_table_ids = pulumi.Output.all(public_table.id)
            return
        nat_count = 1 if args.single_nat_gateway else len(zones)
        routes = self._nat_routes(vpc, gateway, public_subnets[:nat_count])
        private_subnets, private_tables = [], []
        for index, (zone, cidr) in enumerate(zip(zones, private_cidrs, strict=True)):
            subnet = aws.ec2.Subnet(
                f"{name}-private-{index}",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={
                    "Name": f"{prefix}-private-{zone}",
                    "kubernetes.io/role/internal-elb": "1",
                    **args.private_subnet_tags,
                },
                opts=self._child(),
            )
            table = aws.ec2.RouteTable(
                f"{name}-private-{index}",
                vpc_id=vpc.id,
                # With one NAT every zone routes through it; with one per zone a zone outage stays local.
                routes=[routes[index % nat_count]],
                tags={"Name": f"{prefix}-private-{zone}"},
                opts=self._child(),
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{index}", subnet_id=subnet.id, route_table_id=table.id, opts=self._child()
            )
            private_subnets.append(subnet)
            private_tables.append(table)
        self.vpc_id = vpc.id
        self.vpc_cidr = vpc.cidr_block
        self.private_subnet_ids = pulumi.Output.all(*[subnet.id for subnet in private_subnets])
        self.private_route_table_ids = pulumi.Output.all(*[table.id for table in private_tables])

    def _nat_routes(
        self, vpc: aws.ec2.Vpc, gateway: aws.ec2.InternetGateway, subnets: list[aws.ec2.Subnet]
    ) -> list[aws.ec2.RouteTableRouteArgs]:
        """The default route of each NAT's private route table: a NAT instance's interface or a NAT gateway."""
        args, name = self._args, self._name
        prefix = naming.prefix(args.stack)
        if args.egress == "nat_instance":
            group = nat_security_group(name, args.stack, vpc.id, vpc.cidr_block, self)
            instances = nat_instances(name, args.stack, args.nat_instance_type, subnets, group, args.key_arn, self)
            return [
                aws.ec2.RouteTableRouteArgs(
                    cidr_block="0.0.0.0/0", network_interface_id=instance.primary_network_interface_id
                )
                for instance in instances
            ]
        nats = []
        for index, subnet in enumerate(subnets):
            address = aws.ec2.Eip(
                f"{name}-nat-{index}",
                domain="vpc",
                tags={"Name": f"{prefix}-nat-{index}"},
                opts=self._child(),
            )
            nats.append(
                aws.ec2.NatGateway(
                    f"{name}-nat-{index}",
                    allocation_id=address.allocation_id,
                    subnet_id=subnet.id,
                    tags={"Name": f"{prefix}-nat-{index}"},
                    opts=self._child(depends_on=[gateway]),
                )
            )
        return [aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id) for nat in nats]

    def _use_existing(self, vpc_id: str, subnet_ids: list[str]) -> None:
        invoke = pulumi.InvokeOptions(parent=self)
        vpc = aws.ec2.get_vpc(id=vpc_id, opts=invoke)
        tables: list[str] = []
        for subnet_id in subnet_ids:
            # A subnet without a route table association of its own uses the VPC's main table. A lookup by
            # subnet (get_route_table(subnet_id=...)) finds explicit associations only and fails on such a
            # subnet, so list the explicit ones and fall back to the main table the VPC names.
            explicit = aws.ec2.get_route_tables(
                vpc_id=vpc_id,
                filters=[aws.ec2.GetRouteTablesFilterArgs(name="association.subnet-id", values=[subnet_id])],
                opts=invoke,
            ).ids
            table = explicit[0] if explicit else vpc.main_route_table_id
            if table not in tables:
                tables.append(table)
        self.vpc_id = pulumi.Output.from_input(vpc_id)
        self.vpc_cidr = pulumi.Output.from_input(vpc.cidr_block)
        self.private_subnet_ids = pulumi.Output.from_input(subnet_ids)
        self.private_route_table_ids = pulumi.Output.from_input(tables)

    def _s3_gateway_endpoint(self) -> None:
        context = self._args.context
        aws.ec2.VpcEndpoint(
            f"{self._name}-s3",
            vpc_id=self.vpc_id,
            service_name=f"com.amazonaws.{context.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=self.private_route_table_ids,
            tags={"Name": naming.child(self._args.stack, "s3")},
            opts=self._child(),
        )

    def _interface_endpoints(self) -> pulumi.Output[str]:
        args, name = self._args, self._name
        group = aws.ec2.SecurityGroup(
            f"{name}-endpoints",
            description="HTTPS from inside the VPC to its interface endpoints",
            vpc_id=self.vpc_id,
            ingress=[
                aws.ec2.SecurityGroupIngressArgs(
                    description="HTTPS from the VPC",
                    protocol="tcp",
                    from_port=HTTPS,
                    to_port=HTTPS,
                    cidr_blocks=[self.vpc_cidr],
                )
            ],
            tags={"Name": naming.child(args.stack, "endpoints")},
            opts=self._child(),
        )
        for service in args.interface_endpoints:
            aws.ec2.VpcEndpoint(
                f"{name}-{service.replace('.', '-')}",
                vpc_id=self.vpc_id,
                service_name=f"com.amazonaws.{args.context.region}.{service}",
                vpc_endpoint_type="Interface",
                policy=endpoint_policy(service, args.context.account_id),
                private_dns_enabled=True,
                subnet_ids=self.private_subnet_ids,
                security_group_ids=[group.id],
                tags={"Name": naming.child(args.stack, service.replace(".", "-"))},
                opts=self._child(),
            )
        return group.id
