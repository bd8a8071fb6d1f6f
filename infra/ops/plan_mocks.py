"""Pulumi mocks that stand in for the engine and the AWS provider when no Pulumi CLI or AWS account exists.

A mock is the only way to run the program here (no Pulumi CLI, no provider plugins, no AWS account), so it
answers like the real provider would: ids and ARNs in AWS's formats, names the way Pulumi auto-names, and
the data sources the program reads (caller identity, AZs and the types they offer, SSM parameters, existing
VPC lookups).
`infra.ops.plan_monitor.RecordingMonitor` keeps every registration, which the plan is made from.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pulumi.runtime import MockCallArgs, MockResourceArgs, Mocks

ACCOUNT_ID = "123456789012"


def _hex(seed: str, length: int = 17) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length]


@dataclass
class PlanMocks(Mocks):
    """Realistic outputs per AWS resource type and answers to the data sources the program calls."""

    region: str
    account_id: str = ACCOUNT_ID
    # Every data-source call as (token, provider reference): tests check none goes to a default provider.
    calls: list[tuple[str, str]] = field(default_factory=list)

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        outputs = dict(args.inputs)
        builder = _RESOURCE_OUTPUTS.get(args.typ)
        resource_id = f"{args.name}-{_hex(args.name, 8)}"
        if builder is not None:
            resource_id, extra = builder(self, args)
            outputs.update(extra)
        elif args.typ.startswith("aws:"):
            outputs.setdefault("arn", self._generic_arn(args.typ, args.name))
        if args.typ.startswith("aws:") and "tags" in outputs:
            outputs.setdefault("tagsAll", outputs["tags"])
        outputs.setdefault("id", resource_id)
        return resource_id, outputs

    def call(self, args: MockCallArgs) -> dict[str, Any]:  # type: ignore[override]
        self.calls.append((args.token, args.provider or ""))
        answer = _CALLS.get(args.token)
        if answer is None:
            raise NotImplementedError(f"the plan's mocks do not answer {args.token}; add it to infra/ops/plan_mocks.py")
        return answer(self, dict(args.args))

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        where, who = (self.region if region else ""), (self.account_id if account else "")
        return f"arn:aws:{service}:{where}:{who}:{resource}"

    def _generic_arn(self, typ: str, name: str) -> str:
        service = typ.split(":")[1].split("/")[0]
        kind = typ.rsplit(":", 1)[-1].lower()
        return self.arn(service, f"{kind}/{name}")


Builder = Callable[[PlanMocks, MockResourceArgs], tuple[str, dict[str, Any]]]


def _physical_name(args: MockResourceArgs, key: str = "name") -> str:
    # Pulumi auto-names a resource `<logical name>-<7 hex>` when the program gives no physical name.
    given = args.inputs.get(key)
    return str(given) if given else f"{args.name}-{_hex(args.name, 7)}"


def _bucket(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    name = _physical_name(args, "bucket")
    return name, {
        "bucket": name,
        "arn": f"arn:aws:s3:::{name}",
        "bucketDomainName": f"{name}.s3.amazonaws.com",
        "bucketRegionalDomainName": f"{name}.s3.{mocks.region}.amazonaws.com",
        "region": mocks.region,
    }


def _kms_key(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    digest = _hex(args.name, 32)
    key_id = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return key_id, {"keyId": key_id, "arn": mocks.arn("kms", f"key/{key_id}")}


def _kms_alias(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    name = _physical_name(args)
    return name, {
        "arn": mocks.arn("kms", name),
        "targetKeyArn": mocks.arn("kms", f"key/{args.inputs.get('targetKeyId')}"),
    }


def _sns_topic(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    name = _physical_name(args)
    arn = mocks.arn("sns", name)
    return arn, {"name": name, "arn": arn}


def _iam(kind: str) -> Builder:
    def build(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        name = _physical_name(args)
        arn = mocks.arn("iam", f"{kind}/{name}", region=False)
        # Policies are addressed by ARN; roles and instance profiles by name.
        resource_id = arn if kind == "policy" else name
        return resource_id, {"name": name, "arn": arn, "uniqueId": f"AROA{_hex(name, 17).upper()}"}

    return build


def _ec2(prefix: str, kind: str) -> Builder:
    def build(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id = f"{prefix}-{_hex(args.name)}"
        outputs: dict[str, Any] = {
            "arn": mocks.arn("ec2", f"{kind}/{resource_id}"),
            "ownerId": mocks.account_id,
        }
        if prefix == "vpc":
            outputs["defaultSecurityGroupId"] = f"sg-{_hex(args.name + 'default')}"
            outputs["mainRouteTableId"] = f"rtb-{_hex(args.name + 'main')}"
        if prefix == "lt":
            outputs.update(latestVersion=1, defaultVersion=1, name=_physical_name(args))
        if prefix == "i":
            # The NAT instance's default route names this interface (infra/components/nat_instance.py).
            outputs["primaryNetworkInterfaceId"] = f"eni-{_hex(args.name + 'eni')}"
            outputs["publicIp"] = "198.51.100.20"
        if prefix == "eipalloc":
            outputs["publicIp"] = "198.51.100.10"
            outputs["allocationId"] = resource_id
        return resource_id, outputs

    return build


def _named(service: str, kind: str, *, id_is_arn: bool = False) -> Builder:
    def build(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        name = _physical_name(args)
        arn = mocks.arn(service, f"{kind}{name}")
        return (arn if id_is_arn else name), {"name": name, "arn": arn}

    return build


def _secret(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    name = _physical_name(args)
    arn = mocks.arn("secretsmanager", f"secret:{name}-{_hex(name, 6)}")
    return arn, {"name": name, "arn": arn}


def _secret_version(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    version = _hex(args.name, 32)
    return f"{args.inputs.get('secretId')}|{version}", {
        "versionId": version,
        "arn": args.inputs.get("secretId"),
    }


# A CA certificate's DER is ~1 KiB; 780 bytes make 16 PEM lines of 64 and one of 16 characters whatever the name,
# so no line is 40 characters standing alone (what `secret-values` takes for an AWS secret key).
CA_DER_BYTES = 780


def mock_certificate_authority(cluster_name: str) -> str:
    """certificate-authority-data shaped as EKS returns it: a PEM certificate, base64-encoded as a whole."""
    der = b"".join(hashlib.sha256(f"{cluster_name}:{index}".encode()).digest() for index in range(25))[:CA_DER_BYTES]
    body = base64.b64encode(der).decode()
    lines = [body[start : start + 64] for start in range(0, len(body), 64)]
    pem = "\n".join(["-----BEGIN CERTIFICATE-----", *lines, "-----END CERTIFICATE-----", ""])
    return base64.b64encode(pem.encode()).decode()


def kubeconfig(cluster_name: str, region: str) -> dict[str, Any]:
    """A kubeconfig shaped like the one pulumi_eks returns (exec auth through `aws eks get-token`)."""
    server = f"https://{_hex(cluster_name, 32).upper()}.gr7.{region}.eks.amazonaws.com"
    ca = mock_certificate_authority(cluster_name)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "contexts": [{"name": "aws", "context": {"cluster": cluster_name, "user": "aws"}}],
        "current-context": "aws",
        "users": [
            {
                "name": "aws",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "aws",
                        "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region],
                    }
                },
            }
        ],
    }


def _eks_cluster(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    # pulumi_eks.Cluster is a remote component: under mocks only its outputs exist, never its inner resources.
    name = _physical_name(args)
    config = kubeconfig(name, mocks.region)
    issuer = f"https://oidc.eks.{mocks.region}.amazonaws.com/id/{_hex(name, 32).upper()}"
    return name, {
        "kubeconfig": config,
        "kubeconfigJson": json.dumps(config),
        "clusterSecurityGroupId": f"sg-{_hex(name + 'cluster')}",
        "nodeSecurityGroupId": f"sg-{_hex(name + 'node')}",
        "oidcIssuer": issuer.removeprefix("https://"),
        "oidcProviderUrl": issuer,
        "oidcProviderArn": mocks.arn("iam", f"oidc-provider/{issuer.removeprefix('https://')}", region=False),
    }


def _sqs_queue(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    name = _physical_name(args)
    url = f"https://sqs.{mocks.region}.amazonaws.com/{mocks.account_id}/{name}"
    return url, {"name": name, "arn": mocks.arn("sqs", name), "url": url}


def _ecr_repository(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    name = _physical_name(args)
    return name, {
        "name": name,
        "arn": mocks.arn("ecr", f"repository/{name}"),
        "registryId": mocks.account_id,
        "repositoryUrl": f"{mocks.account_id}.dkr.ecr.{mocks.region}.amazonaws.com/{name}",
    }


def _docker_image(_: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    # As docker-build reports a pushed image: its digest, and `ref` = the first tag pinned to that digest.
    tags = [str(tag) for tag in args.inputs.get("tags") or []]
    digest = f"sha256:{_hex('|'.join(tags) or args.name, 64)}"
    return digest, {"digest": digest, "ref": f"{tags[0]}@{digest}" if tags else "", "contextHash": _hex(digest)}


def _http_api(mocks: PlanMocks, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
    # The Lambda permission's sourceArn is built from executionArn: it names this account, as AWS's does.
    api_id = _hex(args.name, 10).lower()
    return api_id, {
        "arn": mocks.arn("apigateway", f"/apis/{api_id}", account=False),
        "executionArn": mocks.arn("execute-api", api_id),
        "apiEndpoint": f"https://{api_id}.execute-api.{mocks.region}.amazonaws.com",
    }


_RESOURCE_OUTPUTS: dict[str, Builder] = {
    "aws:apigatewayv2/api:Api": _http_api,
    "eks:index:Cluster": _eks_cluster,
    "aws:sqs/queue:Queue": _sqs_queue,
    "aws:s3/bucket:Bucket": _bucket,
    "aws:kms/key:Key": _kms_key,
    "aws:kms/alias:Alias": _kms_alias,
    "aws:sns/topic:Topic": _sns_topic,
    "aws:iam/role:Role": _iam("role"),
    "aws:iam/policy:Policy": _iam("policy"),
    "aws:iam/instanceProfile:InstanceProfile": _iam("instance-profile"),
    "aws:ec2/vpc:Vpc": _ec2("vpc", "vpc"),
    "aws:ec2/subnet:Subnet": _ec2("subnet", "subnet"),
    "aws:ec2/routeTable:RouteTable": _ec2("rtb", "route-table"),
    "aws:ec2/internetGateway:InternetGateway": _ec2("igw", "internet-gateway"),
    "aws:ec2/natGateway:NatGateway": _ec2("nat", "natgateway"),
    "aws:ec2/eip:Eip": _ec2("eipalloc", "elastic-ip"),
    "aws:ec2/instance:Instance": _ec2("i", "instance"),
    "aws:ec2/securityGroup:SecurityGroup": _ec2("sg", "security-group"),
    "aws:ec2/vpcEndpoint:VpcEndpoint": _ec2("vpce", "vpc-endpoint"),
    "aws:ec2/launchTemplate:LaunchTemplate": _ec2("lt", "launch-template"),
    "aws:autoscaling/group:Group": _named("autoscaling", "autoScalingGroup:0:autoScalingGroupName/"),
    "aws:secretsmanager/secret:Secret": _secret,
    "aws:secretsmanager/secretVersion:SecretVersion": _secret_version,
    "aws:cloudwatch/logGroup:LogGroup": _named("logs", "log-group:"),
    "aws:ecr/repository:Repository": _ecr_repository,
    "docker-build:index:Image": _docker_image,
    "aws:lambda/function:Function": _named("lambda", "function:"),
    "aws:sfn/stateMachine:StateMachine": _named("states", "stateMachine:", id_is_arn=True),
    "aws:scheduler/schedule:Schedule": _named("scheduler", "schedule/default/"),
    # Auto-named rules get a name, so a target's `rule` (rule.name) is known, as in a real preview.
    "aws:cloudwatch/eventRule:EventRule": _named("events", "rule/"),
}


def _caller_identity(mocks: PlanMocks, _: dict[str, Any]) -> dict[str, Any]:
    return {
        "accountId": mocks.account_id,
        "arn": f"arn:aws:iam::{mocks.account_id}:user/deployer",
        "userId": "AIDA" + _hex("deployer", 17).upper(),
        "id": mocks.account_id,
    }


def _partition(_: PlanMocks, __: dict[str, Any]) -> dict[str, Any]:
    return {
        "partition": "aws",
        "dnsSuffix": "amazonaws.com",
        "reverseDnsPrefix": "com.amazonaws",
        "id": "aws",
    }


def _region(mocks: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    region = args.get("region") or args.get("name") or mocks.region
    return {
        "region": region,
        "name": region,
        "id": region,
        "endpoint": f"ec2.{region}.amazonaws.com",
        "description": region,
    }


def _availability_zones(mocks: PlanMocks, _: dict[str, Any]) -> dict[str, Any]:
    letters = "abcdef"
    return {
        "names": [f"{mocks.region}{letter}" for letter in letters],
        "zoneIds": [f"use1-az{index + 1}" for index in range(len(letters))],
        "groupNames": [mocks.region] * len(letters),
        "id": mocks.region,
    }


# Where the mocks say a type is not offered (zone letter -> type prefixes). A stand-in shaped like AWS's answer,
# not AWS's table: it gives the plan a zone without the GPUs, so choosing zones by offering shows in it.
OFFERING_GAPS: dict[str, tuple[str, ...]] = {"a": ("p4d.",), "e": ("g5.", "p4d.")}


def _instance_type_offerings(mocks: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    wanted = [value for item in args.get("filters") or [] for value in item.get("values") or []]
    pairs = [
        (instance_type, f"{mocks.region}{letter}")
        for letter in "abcdef"
        for instance_type in wanted
        if not instance_type.startswith(OFFERING_GAPS.get(letter, ()))
    ]
    return {
        "id": mocks.region,
        "filters": args.get("filters"),
        "locationType": args.get("locationType") or "availability-zone",
        "instanceTypes": [instance_type for instance_type, _ in pairs],
        "locations": [zone for _, zone in pairs],
        "locationTypes": ["availability-zone"] * len(pairs),
    }


def _ssm_parameter(_: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    name = str(args.get("name"))
    return {
        "name": name,
        "value": f"ami-{_hex(name)}",
        "insecureValue": f"ami-{_hex(name)}",
        "type": "String",
        "version": 1,
        "arn": f"arn:aws:ssm:::parameter{name}",
        "id": name,
    }


def _iam_role(mocks: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    # Service-linked roles live under aws-service-role/<service>/; the plan's only lookup is Auto Scaling's.
    name = str(args.get("name"))
    path = "/aws-service-role/autoscaling.amazonaws.com/" if name == "AWSServiceRoleForAutoScaling" else "/"
    return {
        "name": name,
        "id": name,
        "arn": f"arn:aws:iam::{mocks.account_id}:role{path}{name}",
        "path": path,
        "uniqueId": "AROA" + _hex(name, 17).upper(),
        "assumeRolePolicy": "{}",
        "createDate": "2026-01-01T00:00:00Z",
        "description": "",
        "maxSessionDuration": 3600,
        "permissionsBoundary": "",
        "roleLastUsed": [],
        "tags": {},
    }


def _vpc(_: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    vpc_id = str(args.get("id"))
    return {
        "id": vpc_id,
        "cidrBlock": "10.0.0.0/16",
        "mainRouteTableId": f"rtb-{_hex(vpc_id)}",
        "state": "available",
    }


def _route_table(_: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    # Subnets of an existing VPC share route tables in pairs, as a single-NAT layout does.
    subnet_id = str(args.get("subnetId"))
    table = f"rtb-{_hex(subnet_id[:-1])}"
    return {"id": table, "routeTableId": table, "subnetId": subnet_id, "vpcId": args.get("vpcId") or ""}


def _route_tables(_: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    # The explicit associations of a subnet; a subnet id with "main" in it has none (it uses the main table).
    subnets = [value for item in args.get("filters") or [] for value in item.get("values") or []]
    ids = [f"rtb-{_hex(subnet[:-1])}" for subnet in subnets if "main" not in subnet]
    return {"ids": ids, "id": args.get("vpcId") or "", "vpcId": args.get("vpcId") or "", "filters": args.get("filters")}


def _get_kubeconfig(mocks: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    # `Cluster.get_kubeconfig()` is a method call on the remote component; the call carries it as `__self__`.
    return {"result": json.dumps(kubeconfig("cluster", mocks.region))}


def _ecr_authorization_token(mocks: PlanMocks, args: dict[str, Any]) -> dict[str, Any]:
    registry = args.get("registryId") or mocks.account_id
    return {
        "authorizationToken": "offline-plan-token",
        "expiresAt": "2030-01-01T00:00:00Z",
        "id": mocks.region,
        "password": "offline-plan-password",
        "proxyEndpoint": f"https://{registry}.dkr.ecr.{mocks.region}.amazonaws.com",
        "userName": "AWS",
    }


_CALLS: dict[str, Callable[[PlanMocks, dict[str, Any]], dict[str, Any]]] = {
    "eks:index:Cluster/getKubeconfig": _get_kubeconfig,
    "aws:index/getCallerIdentity:getCallerIdentity": _caller_identity,
    "aws:index/getPartition:getPartition": _partition,
    "aws:index/getRegion:getRegion": _region,
    "aws:index/getAvailabilityZones:getAvailabilityZones": _availability_zones,
    "aws:ssm/getParameter:getParameter": _ssm_parameter,
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": _instance_type_offerings,
    "aws:ec2/getVpc:getVpc": _vpc,
    "aws:iam/getRole:getRole": _iam_role,
    "aws:ec2/getRouteTable:getRouteTable": _route_table,
    "aws:ec2/getRouteTables:getRouteTables": _route_tables,
    "aws:ecr/getAuthorizationToken:getAuthorizationToken": _ecr_authorization_token,
}
