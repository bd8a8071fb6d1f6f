"""Each component alone, under the plan's Pulumi mocks.

Mocks because no Pulumi engine, provider plugin or AWS account can run here; they answer like the AWS
provider would (ids, ARNs, zones, SSM parameters, VPC lookups).
"""

from __future__ import annotations

import base64
import ipaddress
import json
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_aws as aws
import pytest

from infra import naming, versions
from infra.aws_context import AwsContext
from infra.components.alerts import Alerts, AlertsArgs
from infra.components.job_access import JobAccess, JobAccessArgs, static_prefix
from infra.components.kms import EncryptionKey, EncryptionKeyArgs
from infra.components.network import Network, NetworkArgs, subnet_cidrs
from infra.components.providers import Providers, ProvidersArgs
from infra.components.secrets import JobSecrets, JobSecretsArgs
from infra.components.spot_node import SpotNode, SpotNodeArgs
from infra.components.storage import DataBucket, DataBucketArgs
from infra.config import load_stack_config
from infra.ops.plan import run_under_mocks
from infra.ops.plan_mocks import _hex
from infra.rules.plan_view import SECRET_MASK

Plan = list[dict[str, Any]]
CONTEXT = AwsContext(account_id="123456789012", partition="aws", region="us-east-1", dns_suffix="amazonaws.com")
KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"


def plan_of(build: Callable[[], object]) -> Plan:
    return run_under_mocks(build, stack="test", region=CONTEXT.region)


def of_type(plan: Plan, type_token: str) -> list[dict[str, Any]]:
    return [item for item in plan if item["type"] == type_token]


def one(plan: Plan, type_token: str) -> dict[str, Any]:
    found = of_type(plan, type_token)
    assert len(found) == 1, f"{len(found)} of {type_token}"
    return found[0]


def _network(**overrides: Any) -> NetworkArgs:
    args: dict[str, Any] = {
        "stack": "test",
        "context": CONTEXT,
        "vpc_cidr": "10.40.0.0/16",
        "az_count": 3,
        "single_nat_gateway": False,
        "interface_endpoints": ["ecr.api", "sts"],
    }
    return NetworkArgs(**{**args, **overrides})


def test_providers_carry_every_cost_tag() -> None:
    config = load_stack_config("small", {"cost_center": "cc-7", "extra_tags": {"Team": "ml"}})
    tags = naming.cost_tags("small", config)
    plan = plan_of(lambda: Providers("providers", ProvidersArgs(region="eu-west-1", tags=tags)))
    providers = {item["name"]: item["inputs"] for item in of_type(plan, "pulumi:providers:aws")}
    assert providers["providers-aws"]["region"] == "eu-west-1"
    assert providers["providers-aws-billing"]["region"] == "us-east-1"
    for inputs in providers.values():
        default_tags = json.loads(inputs["defaultTags"])["tags"]
        assert set(naming.COST_TAG_KEYS) <= set(default_tags)
        assert default_tags["CostCenter"] == "cc-7" and default_tags["Team"] == "ml"
        # The Stack tag's value is the stack's full name: what the cost controls filter on (docs/cost.md).
        assert default_tags["Stack"] == "llm-batch-small" and default_tags["Tier"] == "small"


def test_kms_key_rotates_and_admits_only_this_account() -> None:
    plan = plan_of(lambda: EncryptionKey("kms", EncryptionKeyArgs(stack="test", context=CONTEXT)))
    key = one(plan, "aws:kms/key:Key")["inputs"]
    assert key["enableKeyRotation"] is True
    statements = json.loads(key["policy"])["Statement"]
    principals = [statement["Principal"] for statement in statements]
    assert {"AWS": "arn:aws:iam::123456789012:root"} in principals
    assert all(p != "*" and p.get("AWS") != "*" for p in principals)
    service_statements = [s for s in statements if "Service" in s["Principal"]]
    # EventBridge is the one service without a condition: its deliveries to an encrypted topic carry no
    # aws:SourceAccount (issue 33); it may only make data keys, and the topic policy pins it to this account.
    (eventbridge,) = [s for s in service_statements if "Condition" not in s]
    assert eventbridge["Principal"] == {"Service": "events.amazonaws.com"}
    assert eventbridge["Action"] == ["kms:GenerateDataKey*", "kms:Decrypt"]
    others = [s for s in service_statements if s is not eventbridge]
    assert others and all("events.amazonaws.com" not in str(s["Principal"]) for s in others)
    assert one(plan, "aws:kms/alias:Alias")["inputs"]["name"] == "alias/llm-batch-test"


def test_data_bucket_is_encrypted_private_versioned_and_archived() -> None:
    args = DataBucketArgs(
        stack="test",
        context=CONTEXT,
        key_arn=KEY_ARN,
        glacier_after_days=45,
        noncurrent_expire_days=120,
        archive_prefixes=["input/", "output/"],
    )
    plan = plan_of(lambda: DataBucket("storage", args))
    bucket = one(plan, "aws:s3/bucket:Bucket")
    assert bucket["inputs"]["bucket"] == "llm-batch-test-data-123456789012-us-east-1"
    assert bucket["inputs"]["forceDestroy"] is False
    rule = one(plan, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")[
        "inputs"
    ]["rules"][0]
    assert rule["applyServerSideEncryptionByDefault"] == {
        "sseAlgorithm": "aws:kms",
        "kmsMasterKeyId": KEY_ARN,
    }
    assert rule["bucketKeyEnabled"] is True
    assert one(plan, "aws:s3/bucketVersioning:BucketVersioning")["inputs"]["versioningConfiguration"] == {
        "status": "Enabled"
    }
    ownership = one(plan, "aws:s3/bucketOwnershipControls:BucketOwnershipControls")["inputs"]["rule"]
    assert ownership == {"objectOwnership": "BucketOwnerEnforced"}
    rules = {
        rule["id"]: rule
        for rule in one(plan, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")["inputs"]["rules"]
    }
    # The Batch API's and the queue's rules beside the archive ones (tests/infra/test_bucket_retention.py).
    assert set(rules) == {
        "archive-input",
        "archive-output",
        "deleted-batch-api",
        "deleted-control",
        "retention-batch-api-files",
        "retention-batch-api-batches",
        "retention-batch-api-uploads",
        "abort-incomplete-uploads",
    }
    assert rules["archive-input"]["filter"] == {"prefix": "input/"}
    assert rules["archive-input"]["transitions"] == [{"days": 45, "storageClass": "GLACIER"}]
    assert rules["archive-output"]["noncurrentVersionExpiration"] == {"noncurrentDays": 120}
    policy = json.loads(one(plan, "aws:s3/bucketPolicy:BucketPolicy")["inputs"]["policy"])
    arn = "arn:aws:s3:::llm-batch-test-data-123456789012-us-east-1"
    assert all(s["Effect"] == "Deny" and s["Resource"] == [arn, f"{arn}/*"] for s in policy["Statement"])


@pytest.mark.parametrize("email", [None, "oncall@example.com"])
def test_alerts_topic_is_encrypted_and_subscribes_the_email(email: str | None) -> None:
    plan = plan_of(lambda: Alerts("alerts", AlertsArgs("test", CONTEXT, KEY_ARN, email)))
    assert one(plan, "aws:sns/topic:Topic")["inputs"]["kmsMasterKeyId"] == KEY_ARN
    subscriptions = of_type(plan, "aws:sns/topicSubscription:TopicSubscription")
    assert [s["inputs"]["endpoint"] for s in subscriptions] == ([email] if email else [])
    policy = json.loads(one(plan, "aws:sns/topicPolicy:TopicPolicy")["inputs"]["policy"])
    publishers = next(s for s in policy["Statement"] if s["Sid"] == "ServicesPublishAlerts")
    assert "budgets.amazonaws.com" in publishers["Principal"]["Service"]
    assert publishers["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_network_creates_private_subnets_per_zone_with_nat_and_endpoints() -> None:
    plan = plan_of(lambda: Network("network", _network()))
    vpc = one(plan, "aws:ec2/vpc:Vpc")
    private = sorted(
        (s for s in of_type(plan, "aws:ec2/subnet:Subnet") if "private" in s["name"]), key=lambda s: s["name"]
    )
    assert [s["inputs"]["availabilityZone"] for s in private] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    network = ipaddress.IPv4Network("10.40.0.0/16")
    cidrs = [ipaddress.IPv4Network(s["inputs"]["cidrBlock"]) for s in of_type(plan, "aws:ec2/subnet:Subnet")]
    assert all(cidr.subnet_of(network) for cidr in cidrs)
    assert len(set(cidrs)) == 6 and not any(a.overlaps(b) for a in cidrs for b in cidrs if a != b)
    assert all(s["inputs"]["mapPublicIpOnLaunch"] is False for s in of_type(plan, "aws:ec2/subnet:Subnet"))
    # The default egress: a NAT instance per zone (no NAT gateway), each private table routed to its interface.
    assert of_type(plan, "aws:ec2/natGateway:NatGateway") == [] and of_type(plan, "aws:ec2/eip:Eip") == []
    nats = of_type(plan, "aws:ec2/instance:Instance")
    assert len(nats) == 3
    public_ids = {s["id"] for s in of_type(plan, "aws:ec2/subnet:Subnet") if "public" in s["name"]}
    assert {n["inputs"]["subnetId"] for n in nats} == public_ids
    for nat in nats:
        inputs = nat["inputs"]
        assert inputs["sourceDestCheck"] is False and inputs["associatePublicIpAddress"] is True
        assert inputs["instanceType"] == "t4g.nano" and "keyName" not in inputs
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
        assert inputs["rootBlockDevice"]["encrypted"] is True
        assert "masquerade" in inputs["userData"] and "ip_forward = 1" in inputs["userData"]
    private_tables = [t for t in of_type(plan, "aws:ec2/routeTable:RouteTable") if "private" in t["name"]]
    interfaces = {n["outputs"]["primaryNetworkInterfaceId"] for n in nats}
    assert {t["inputs"]["routes"][0]["networkInterfaceId"] for t in private_tables} == interfaces
    nat_group = next(g for g in of_type(plan, "aws:ec2/securityGroup:SecurityGroup") if g["name"] == "network-nat")[
        "inputs"
    ]
    assert [(r["protocol"], r["fromPort"], r["toPort"], r["cidrBlocks"]) for r in nat_group["ingress"]] == [
        ("tcp", 443, 443, [vpc["inputs"]["cidrBlock"]])
    ]
    assert [(r["protocol"], r["fromPort"], r["toPort"]) for r in nat_group["egress"]] == [("tcp", 443, 443)]
    endpoints = {e["inputs"]["serviceName"]: e["inputs"] for e in of_type(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")}
    assert endpoints["com.amazonaws.us-east-1.s3"]["vpcEndpointType"] == "Gateway"
    assert sorted(endpoints["com.amazonaws.us-east-1.s3"]["routeTableIds"]) == sorted(t["id"] for t in private_tables)
    for service in ("ecr.api", "sts"):
        interface = endpoints[f"com.amazonaws.us-east-1.{service}"]
        assert interface["privateDnsEnabled"] is True
        assert sorted(interface["subnetIds"]) == sorted(s["id"] for s in private)
    groups = {g["name"]: g["inputs"] for g in of_type(plan, "aws:ec2/securityGroup:SecurityGroup")}
    assert groups["network-endpoints"]["ingress"][0]["cidrBlocks"] == [vpc["inputs"]["cidrBlock"]]
    default_group = one(plan, "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")["inputs"]
    assert not default_group.get("ingress") and not default_group.get("egress")


def test_network_single_nat_serves_every_zone() -> None:
    args = _network(single_nat_gateway=True, interface_endpoints=[], egress="nat_gateway")
    plan = plan_of(lambda: Network("network", args))
    nat = one(plan, "aws:ec2/natGateway:NatGateway")
    private_tables = [t for t in of_type(plan, "aws:ec2/routeTable:RouteTable") if "private" in t["name"]]
    assert len(private_tables) == 3
    assert {t["inputs"]["routes"][0]["natGatewayId"] for t in private_tables} == {nat["id"]}
    assert of_type(plan, "aws:ec2/securityGroup:SecurityGroup") == []  # no interface endpoints, no group
    assert of_type(plan, "aws:ec2/instance:Instance") == []
    # The same with NAT instances: one instance, every zone's table routed to its interface.
    plan = plan_of(lambda: Network("network", _network(single_nat_gateway=True, interface_endpoints=[])))
    instance = one(plan, "aws:ec2/instance:Instance")
    private_tables = [t for t in of_type(plan, "aws:ec2/routeTable:RouteTable") if "private" in t["name"]]
    interface = instance["outputs"]["primaryNetworkInterfaceId"]
    assert {t["inputs"]["routes"][0]["networkInterfaceId"] for t in private_tables} == {interface}


def test_network_in_public_subnets_has_no_nat_and_routes_s3_through_the_gateway_endpoint() -> None:
    """The small tier's `network.egress: public_subnets`: the node's subnets are the public ones."""
    plan = plan_of(lambda: Network("network", _network(az_count=2, interface_endpoints=[], egress="public_subnets")))
    subnets = of_type(plan, "aws:ec2/subnet:Subnet")
    assert [s["name"] for s in subnets] == ["network-public-0", "network-public-1"]
    assert all(s["inputs"]["mapPublicIpOnLaunch"] is True for s in subnets)
    assert not {item["type"] for item in plan} & {"aws:ec2/natGateway:NatGateway", "aws:ec2/instance:Instance"}
    (table,) = of_type(plan, "aws:ec2/routeTable:RouteTable")
    assert [route.get("gatewayId") for route in table["inputs"]["routes"]] == [
        one(plan, "aws:ec2/internetGateway:InternetGateway")["id"]
    ]
    (s3,) = of_type(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")
    assert s3["inputs"]["vpcEndpointType"] == "Gateway" and s3["inputs"]["routeTableIds"] == [table["id"]]


def test_network_uses_an_existing_vpc_and_its_route_tables() -> None:
    subnets = ["subnet-0a1", "subnet-0a2", "subnet-0b1"]
    args = _network(existing_vpc_id="vpc-0123", existing_private_subnet_ids=subnets, interface_endpoints=["logs"])
    plan = plan_of(lambda: Network("network", args))
    created = {item["type"] for item in plan}
    assert not created & {"aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", "aws:ec2/natGateway:NatGateway"}
    endpoints = {e["inputs"]["serviceName"]: e["inputs"] for e in of_type(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")}
    s3 = endpoints["com.amazonaws.us-east-1.s3"]
    assert s3["vpcId"] == "vpc-0123"
    # The mocks give subnet-0a1 and subnet-0a2 one shared table: each table is routed once.
    assert len(s3["routeTableIds"]) == 2
    assert endpoints["com.amazonaws.us-east-1.logs"]["subnetIds"] == subnets
    group = one(plan, "aws:ec2/securityGroup:SecurityGroup")["inputs"]
    assert group["ingress"][0]["cidrBlocks"] == ["10.0.0.0/16"]  # the looked-up VPC's CIDR


def test_an_existing_subnet_on_the_main_route_table_is_routed_through_it() -> None:
    """AWS: a subnet with no association of its own uses the VPC's main table (the mocks' "main" subnets)."""
    subnets = ["subnet-main1", "subnet-0a1"]
    args = _network(existing_vpc_id="vpc-0123", existing_private_subnet_ids=subnets, interface_endpoints=[])
    plan = plan_of(lambda: Network("network", args))
    s3 = next(e["inputs"] for e in of_type(plan, "aws:ec2/vpcEndpoint:VpcEndpoint"))
    main_table = f"rtb-{_hex('vpc-0123')}"  # what the mocked get_vpc names as the VPC's main route table
    assert s3["routeTableIds"] == [main_table, f"rtb-{_hex('subnet-0a')}"]


def test_network_refuses_more_zones_than_the_region_has() -> None:
    with pytest.raises(ValueError, match=r"network\.az_count is 7 but us-east-1 has only 6 zones"):
        plan_of(lambda: Network("network", _network(az_count=7)))


def test_subnet_cidrs_split_the_vpc() -> None:
    private, public = subnet_cidrs("10.0.0.0/16", 2)
    assert private == ["10.0.0.0/20", "10.0.16.0/20"] and public == ["10.0.128.0/20", "10.0.144.0/20"]


@pytest.mark.parametrize("token", [None, "hf_not_a_real_token"])
def test_job_secrets_are_encrypted_and_masked(token: str | None) -> None:
    args = JobSecretsArgs(stack="test", key_arn=KEY_ARN, job_settings="model: {}\n", hub_token=token)
    plan = plan_of(lambda: JobSecrets("secrets", args))
    secrets = of_type(plan, "aws:secretsmanager/secret:Secret")
    assert {s["inputs"]["name"] for s in secrets} == {
        "llm-batch-test/job-settings",
        "llm-batch-test/hub-token",
    }
    assert all(s["inputs"]["kmsKeyId"] == KEY_ARN for s in secrets)
    versions_ = of_type(plan, "aws:secretsmanager/secretVersion:SecretVersion")
    assert len(versions_) == (2 if token else 1)
    assert all(v["inputs"]["secretString"] == SECRET_MASK for v in versions_)
    assert "hf_not_a_real_token" not in json.dumps(plan)


def test_job_access_grants_only_its_prefixes_key_and_secrets() -> None:
    secret_arns = ["arn:aws:secretsmanager:us-east-1:123456789012:secret:a", "arn:...:secret:b"]
    args = JobAccessArgs(
        stack="test",
        context=CONTEXT,
        bucket_arn="arn:aws:s3:::data",
        key_arn=KEY_ARN,
        secret_arns=secret_arns,
        read_prefixes=["input/", "models/"],
        write_prefixes=["output/", "checkpoints/"],
        image_repository_arn="arn:aws:ecr:us-east-1:123456789012:repository/llm-batch/workload",
        metrics_namespace="NS",
        log_retention_days=14,
    )
    plan = plan_of(lambda: JobAccess("job", args))
    logs = one(plan, "aws:cloudwatch/logGroup:LogGroup")["inputs"]
    assert logs == {"name": "/llm-batch/test/job", "retentionInDays": 14, "kmsKeyId": KEY_ARN}
    statements = {s["Sid"]: s for s in json.loads(one(plan, "aws:iam/policy:Policy")["inputs"]["policy"])["Statement"]}
    writes = statements["WriteOutputsAndCheckpoints"]["Resource"]
    assert writes == ["arn:aws:s3:::data/checkpoints/*", "arn:aws:s3:::data/output/*"]
    assert "arn:aws:s3:::data/input/*" in statements["ReadInputsModelsAndOwnOutputs"]["Resource"]
    assert statements["UseStackKey"]["Resource"] == KEY_ARN
    assert statements["ReadJobSecrets"]["Resource"] == secret_arns
    assert statements["PublishJobMetrics"]["Condition"] == {"StringEquals": {"cloudwatch:namespace": "NS"}}
    # GetBucketLocation carries no s3:prefix: a statement conditioned on one would never allow it.
    assert statements["FindBucketRegion"]["Action"] == ["s3:GetBucketLocation"]
    assert "Condition" not in statements["FindBucketRegion"]
    assert statements["ListOwnPrefixes"]["Action"] == ["s3:ListBucket"]
    s3_actions = {a for s in statements.values() for a in s["Action"] if a.startswith("s3:")}
    assert s3_actions == {
        "s3:ListBucket",
        "s3:GetBucketLocation",
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
    }


@pytest.mark.parametrize(
    ("template", "prefix"),
    [("input/{date}/", "input/"), ("runs/{date}/in/", "runs/"), ("fixed/", "fixed/"), ("a/b{date}/", "a/")],
)
def test_static_prefix(template: str, prefix: str) -> None:
    assert static_prefix(template) == prefix


def _spot_node(**overrides: Any) -> SpotNodeArgs:
    args: dict[str, Any] = {
        "stack": "test",
        "context": CONTEXT,
        "tags": {"CostCenter": "cc", "Stack": "test"},
        "instance_type": "g5.xlarge",
        "root_volume_gib": 200,
        "ami_ssm_parameter": versions.GPU_AMI_SSM_PARAMETER,
        "max_spot_price": None,
        "vpc_id": "vpc-1",
        "subnet_ids": ["subnet-a", "subnet-b"],
        "key_arn": KEY_ARN,
        "job_policy_arn": "arn:aws:iam::123456789012:policy/llm-batch-test-job",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-batch/workload:0.1.0",
        "job_settings_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:settings",
        "hub_token_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:token",
        "log_group_name": "/llm-batch/test/job",
        "output_prefix_uri": "s3://llm-batch-test-data/output/{date}/",
    }
    return SpotNodeArgs(**{**args, **overrides})


def test_spot_node_launch_template_is_locked_down() -> None:
    plan = plan_of(lambda: SpotNode("gpu-node", _spot_node()))
    template = one(plan, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]
    # The AMI comes from the SSM parameter the mocks answer for, never a literal.
    assert template["imageId"].startswith("ami-")
    assert template["instanceType"] == "g5.xlarge"
    assert template["metadataOptions"]["httpTokens"] == "required"
    assert "keyName" not in template
    (root,) = template["blockDeviceMappings"]
    assert root["ebs"] == {
        "volumeSize": 200,
        "volumeType": "gp3",
        "encrypted": "true",
        "kmsKeyId": KEY_ARN,
        "deleteOnTermination": "true",
    }
    script = base64.b64decode(template["userData"]).decode()
    assert "docker run" in script and " run --config /etc/llm-batch/job.yaml" in script
    assert "llm-batch/workload:0.1.0" in script and "secret:settings" in script
    group = one(plan, "aws:ec2/securityGroup:SecurityGroup")["inputs"]
    assert group["ingress"] == [] and group["vpcId"] == "vpc-1"
    role = one(plan, "aws:iam/role:Role")["inputs"]
    assert json.loads(role["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    attached = {a["inputs"]["policyArn"] for a in of_type(plan, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == {"arn:aws:iam::123456789012:policy/llm-batch-test-job"}
    inline = {item["name"]: item["inputs"]["policy"] for item in of_type(plan, "aws:iam/rolePolicy:RolePolicy")}
    session = json.loads(inline["gpu-node-session-manager"])["Statement"]
    assert {action for statement in session for action in statement["Action"]} == {
        "ssm:UpdateInstanceInformation",
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    }
    stand_down = json.loads(inline["gpu-node-stand-down"])["Statement"]
    assert stand_down[0]["Action"] == ["autoscaling:SetDesiredCapacity"]
    assert stand_down[0]["Resource"].endswith(":autoScalingGroupName/llm-batch-test-gpu")


def test_spot_node_group_is_spot_zero_to_one_and_left_to_the_schedule() -> None:
    plan = plan_of(lambda: SpotNode("gpu-node", _spot_node(max_spot_price=0.5)))
    group = one(plan, "aws:autoscaling/group:Group")
    inputs = group["inputs"]
    assert (inputs["minSize"], inputs["maxSize"], inputs["desiredCapacity"]) == (0, 1, 0)
    assert inputs["name"] == "llm-batch-test-gpu" and inputs["capacityRebalance"] is True
    assert inputs["vpcZoneIdentifiers"] == ["subnet-a", "subnet-b"]
    distribution = inputs["mixedInstancesPolicy"]["instancesDistribution"]
    assert distribution["onDemandBaseCapacity"] == 0 and distribution["onDemandPercentageAboveBaseCapacity"] == 0
    assert distribution["spotAllocationStrategy"] == "price-capacity-optimized"
    assert distribution["spotMaxPrice"] == "0.5"
    assert group["ignore_changes"] == ["desiredCapacity"]
    tags = {tag["key"]: tag for tag in inputs["tags"]}
    assert tags["CostCenter"]["propagateAtLaunch"] is True


def test_components_parent_their_children_and_take_the_provider() -> None:
    def build() -> None:
        provider = aws.Provider("aws", region="us-east-1")
        EncryptionKey("kms", EncryptionKeyArgs("test", CONTEXT), pulumi.ResourceOptions(provider=provider))

    plan = plan_of(build)
    component = one(plan, "llmbatch:kms:EncryptionKey")
    provider = one(plan, "pulumi:providers:aws")
    for child in (one(plan, "aws:kms/key:Key"), one(plan, "aws:kms/alias:Alias")):
        assert child["parent"] == component["urn"]
        assert child["provider"] == provider["urn"]


def test_mocks_answer_for_an_eks_cluster_and_its_kubeconfig() -> None:
    """The EKS tiers build on these answers: a remote pulumi_eks.Cluster, its kubeconfig, a k8s provider."""
    import pulumi_eks as eks
    import pulumi_kubernetes as k8s

    seen: dict[str, Any] = {}

    def build() -> None:
        cluster = eks.Cluster("eks", name="llm-batch-test", vpc_id="vpc-1", private_subnet_ids=["a", "b"])
        provider = k8s.Provider("k8s", kubeconfig=cluster.kubeconfig_json)
        k8s.core.v1.Namespace("ns", metadata={"name": "llm-batch"}, opts=pulumi.ResourceOptions(provider=provider))
        cluster.get_kubeconfig().apply(lambda config: seen.setdefault("call", config))

    plan = plan_of(build)
    cluster = one(plan, "eks:index:Cluster")
    config = cluster["outputs"]["kubeconfig"]
    assert config["clusters"][0]["cluster"]["server"].endswith(".gr7.us-east-1.eks.amazonaws.com")
    assert config["users"][0]["user"]["exec"]["args"][:4] == [
        "eks",
        "get-token",
        "--cluster-name",
        "llm-batch-test",
    ]
    assert json.loads(one(plan, "pulumi:providers:kubernetes")["inputs"]["kubeconfig"]) == config
    assert one(plan, "kubernetes:core/v1:Namespace")["inputs"]["metadata"] == {"name": "llm-batch"}
    assert json.loads(seen["call"])["kind"] == "Config"


def test_data_bucket_refuses_a_name_s3_would_reject() -> None:
    args = DataBucketArgs(
        stack="a-very-long-stack-name-for-testing",
        context=CONTEXT,
        key_arn=KEY_ARN,
        glacier_after_days=30,
        noncurrent_expire_days=90,
        archive_prefixes=["input/"],
    )
    with pytest.raises(ValueError, match="longer than S3's 63 characters"):
        plan_of(lambda: DataBucket("storage", args))
