"""A NAT instance: the private subnets' way to HTTPS outside the VPC for a few dollars a month.

A NAT gateway bills 0.045 USD an hour (about 33 USD a month) plus its address and 0.045 USD per GB; the nodes'
bulk traffic (models, data, ECR's image layers) already takes the S3 gateway endpoint, so what is left for NAT
is API calls and small pulls, which the smallest Graviton instance carries (docs/cost.md weighs both).

The instance forwards only what its security group admits: TCP 443 from the VPC in, TCP 443 out, so the
nodes' egress stays HTTPS only even if a node's own group were widened. No SSH key, no inbound from the
internet, IMDSv2 with hop limit 1, the root volume encrypted with the stack key. EC2's automatic recovery
(on by default for this type) restarts it on a failed host; its route stays, since it names the instance's
network interface, which recovery keeps.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from infra import naming, versions

HTTPS = 443

# Forwarding and masquerading with nftables (in the Amazon Linux 2023 image), kept across reboots.
USER_DATA = """#!/bin/bash
set -euo pipefail
echo 'net.ipv4.ip_forward = 1' > /etc/sysctl.d/90-nat.conf
sysctl --system
command -v nft || dnf install -y nftables
iface=$(ip -o -4 route show to default | awk '{print $5}')
cat > /etc/sysconfig/nftables.conf <<NFT
table ip nat {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "$iface" masquerade
  }
}
NFT
systemctl enable --now nftables
systemctl restart nftables
"""


def architecture(instance_type: str) -> str:
    """arm64 for Graviton types (a `g` after the generation digit: t4g, c7g, m7gd), else x86_64."""
    family = instance_type.split(".")[0]
    digits = [index for index, char in enumerate(family) if char.isdigit()]
    return "arm64" if digits and family[digits[-1] + 1 : digits[-1] + 2] == "g" else "x86_64"


def nat_security_group(
    name: str, stack: str, vpc_id: pulumi.Input[str], vpc_cidr: pulumi.Input[str], parent: pulumi.Resource
) -> aws.ec2.SecurityGroup:
    """HTTPS in from the VPC only, HTTPS out only: what the nodes may forward through the instance."""
    return aws.ec2.SecurityGroup(
        f"{name}-nat",
        description="NAT instance: HTTPS from the VPC, HTTPS out",
        vpc_id=vpc_id,
        ingress=[
            aws.ec2.SecurityGroupIngressArgs(
                description="HTTPS from the VPC's nodes", protocol="tcp", from_port=HTTPS, to_port=HTTPS,
                cidr_blocks=[vpc_cidr],
            )
        ],
        egress=[
            aws.ec2.SecurityGroupEgressArgs(
                description="HTTPS out", protocol="tcp", from_port=HTTPS, to_port=HTTPS, cidr_blocks=["0.0.0.0/0"]
            )
        ],
        tags={"Name": naming.child(stack, "nat")},
        opts=pulumi.ResourceOptions(parent=parent),
    )  # fmt: skip


def nat_instances(
    name: str,
    stack: str,
    instance_type: str,
    public_subnets: Sequence[aws.ec2.Subnet],
    group: aws.ec2.SecurityGroup,
    key_arn: pulumi.Input[str] | None,
    parent: pulumi.Resource,
) -> list[aws.ec2.Instance]:
    """One instance in each of `public_subnets`, with a public address of its own and source/dest checks off."""
    image = aws.ssm.get_parameter(
        name=versions.NAT_AMI_SSM_PARAMETERS[architecture(instance_type)], opts=pulumi.InvokeOptions(parent=parent)
    )
    instances = []
    for index, subnet in enumerate(public_subnets):
        instances.append(
            aws.ec2.Instance(
                f"{name}-nat-{index}",
                ami=image.value,
                instance_type=instance_type,
                subnet_id=subnet.id,
                vpc_security_group_ids=[group.id],
                associate_public_ip_address=True,
                source_dest_check=False,  # it forwards the nodes' packets
                user_data=USER_DATA,
                user_data_replace_on_change=True,
                metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                    http_endpoint="enabled",
                    http_tokens="required",
                    http_put_response_hop_limit=1,
                    instance_metadata_tags="disabled",
                ),
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                    volume_type="gp3", encrypted=True, kms_key_id=key_arn, delete_on_termination=True
                ),
                # A new image only on a deliberate replacement, never on every `up` after AWS publishes one.
                tags={"Name": naming.child(stack, f"nat-{index}")},
                volume_tags={"Name": naming.child(stack, f"nat-{index}")},
                opts=pulumi.ResourceOptions(parent=parent, ignore_changes=["ami"]),
            )
        )
    return instances
