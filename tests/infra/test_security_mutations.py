"""Mutation suite: realistic mistakes injected into a real stack's plan, each caught by the rule meant for it.

Every mutation starts from the plan `features_on` captured (the Pulumi program under mocks with the stack's own
config and every opt-in feature on: the Batch API's front, serving), breaks one thing a newcomer could plausibly
write, and asserts that the named rule reports the named resource and that `registry.gate` (what `infra.plan` runs)
refuses the plan. The last test makes sure every rule of the security modules is tripped by some mutation here or in
test_added_resource_mutations.py: a rule no mistake trips does nothing.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.rules import (
    checks_batch_api,
    checks_credentials,
    checks_cross_account,
    checks_egress,
    checks_egress_path,
    checks_iam,
    checks_k8s,
    checks_network,
    checks_ray,
    checks_stores,
)
from tests.infra.mutation_check import Mutation, assert_caught

KEYS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-large/serve-api-keys-AbCdEf"

Plan = list[dict[str, Any]]
ACCOUNT = "123456789012"


def _one(plan: Plan, type_token: str, name: str | None = None) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and (name is None or item["name"] == name)]
    assert found, f"no {type_token} {name or ''} in the plan"
    return found[0]


def _edit_document(item: dict[str, Any], key: str, edit: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(item["inputs"][key])
    edit(document)
    item["inputs"][key] = json.dumps(document)


def _add_statement(plan: Plan, type_token: str, name: str, statement: dict[str, Any], key: str = "policy") -> None:
    _edit_document(_one(plan, type_token, name), key, lambda doc: doc["Statement"].append(statement))


def _new(plan: Plan, like: dict[str, Any], type_token: str, name: str, inputs: dict[str, Any]) -> None:
    """Append a resource of `type_token` under the same provider and parent as `like`."""
    plan.append(
        {
            **copy.deepcopy(like),
            "type": type_token,
            "name": name,
            "urn": f"{like['urn'].rsplit('::', 1)[0]}::{name}",
            "inputs": inputs,
            "id": name,
            "outputs": {},
        }
    )


# --- the mistakes -----------------------------------------------------------------------------------------


def passrole_any_role_by_arn(plan: Plan) -> None:
    def edit(doc: dict[str, Any]) -> None:
        for statement in doc["Statement"]:
            if statement.get("Sid") == "PassNodeRole":
                statement["Resource"] = f"arn:aws:iam::{ACCOUNT}:role/*"

    _edit_document(_one(plan, "aws:iam/rolePolicy:RolePolicy", "karpenter-controller-policy"), "policy", edit)


def passrole_through_action_wildcard(plan: Plan) -> None:
    statement = {"Effect": "Allow", "Action": "iam:Pass*", "Resource": f"arn:aws:iam::{ACCOUNT}:role/llm-batch-*"}
    _add_statement(plan, "aws:iam/policy:Policy", "job-access-policy", statement)


def kms_admin_in_job_policy(plan: Plan) -> None:
    statement = {"Sid": "ManageKey", "Effect": "Allow", "Action": ["kms:Create*", "kms:Put*"], "Resource": "*"}
    _add_statement(plan, "aws:iam/policy:Policy", "job-access-policy", statement)


def job_decrypts_directly(plan: Plan) -> None:
    def edit(doc: dict[str, Any]) -> None:
        for statement in doc["Statement"]:
            if statement.get("Sid") == "UseStackKey":
                statement.pop("Condition")

    _edit_document(_one(plan, "aws:iam/policy:Policy", "job-access-policy"), "policy", edit)


def bucket_as_bucket_v2(plan: Plan) -> None:
    bucket = _one(plan, "aws:s3/bucket:Bucket")
    _new(plan, bucket, "aws:s3/bucketV2:BucketV2", "scratch", {"bucket": "llm-batch-small-scratch"})
    plan[-1]["outputs"] = {"arn": "arn:aws:s3:::llm-batch-small-scratch"}


def bucket_as_directory_bucket(plan: Plan) -> None:
    bucket = _one(plan, "aws:s3/bucket:Bucket")
    _new(plan, bucket, "aws:s3/directoryBucket:DirectoryBucket", "fast", {"bucket": "fast--use1-az4--x-s3"})


def hop_limit_two_on_eks_nodes(plan: Plan) -> None:
    _one(plan, "aws:ec2/launchTemplate:LaunchTemplate", "nodes-gpu-lt")["inputs"]["metadataOptions"][
        "httpPutResponseHopLimit"
    ] = 2


def hop_limit_two_on_karpenter_nodes(plan: Plan) -> None:
    node_class = _one(plan, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    node_class["inputs"]["spec"]["metadataOptions"]["httpPutResponseHopLimit"] = 2


def eks_node_volume_on_aws_ebs_key(plan: Plan) -> None:
    # The template as it was before issue 20: encrypted, but with AWS's own EBS key.
    for device in _one(plan, "aws:ec2/launchTemplate:LaunchTemplate", "nodes-gpu-lt")["inputs"]["blockDeviceMappings"]:
        del device["ebs"]["kmsKeyId"]


def karpenter_node_volume_on_aws_ebs_key(plan: Plan) -> None:
    node_class = _one(plan, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    for device in node_class["inputs"]["spec"]["blockDeviceMappings"]:
        del device["ebs"]["kmsKeyID"]


def key_policy_without_auto_scaling_role(plan: Plan) -> None:
    # Node volumes moved to the stack key, but the key policy forgot the role that launches the managed groups' nodes.
    def edit(doc: dict[str, Any]) -> None:
        doc["Statement"] = [s for s in doc["Statement"] if not s.get("Sid", "").startswith("VolumeLaunchers")]

    _edit_document(_one(plan, "aws:kms/key:Key", "kms-key"), "policy", edit)


def ray_dashboard_on_internet_load_balancer(plan: Plan) -> None:
    account = _one(plan, "kubernetes:core/v1:ServiceAccount")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "ray-dashboard", "namespace": "llm-batch"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 8265}], "selector": {"ray.io/node-type": "head"}},
    }
    _new(plan, account, "kubernetes:core/v1:Service", "ray-dashboard", service)


def job_namespace_without_pod_security(plan: Plan) -> None:
    namespace = _one(plan, "kubernetes:core/v1:Namespace", "job-identity-namespace")
    namespace["inputs"]["metadata"]["labels"].pop("pod-security.kubernetes.io/enforce")


def debug_pod_with_host_path_in_job_namespace(plan: Plan) -> None:
    account = _one(plan, "kubernetes:core/v1:ServiceAccount")
    container = {"name": "debug", "image": "busybox@sha256:" + "0" * 64, "securityContext": {"privileged": True}}
    pod = {
        "metadata": {"name": "debug", "namespace": "llm-batch"},
        "spec": {"containers": [container], "volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
    }
    _new(plan, account, "kubernetes:core/v1:Pod", "debug", pod)


def api_token_back_on_the_workers(plan: Plan) -> None:
    account = _one(plan, "kubernetes:core/v1:ServiceAccount", "job-identity-worker-service-account")
    account["inputs"]["automountServiceAccountToken"] = True


def workers_bound_to_edit(plan: Plan) -> None:
    account = _one(plan, "kubernetes:core/v1:ServiceAccount")
    binding = {
        "metadata": {"name": "workers-edit", "namespace": "llm-batch"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "llm-batch-worker", "namespace": "llm-batch"}],
    }
    _new(plan, account, "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "workers-edit", binding)


def network_policy_enforcement_off(plan: Plan) -> None:
    _one(plan, "eks:index:Cluster")["inputs"].pop("vpcCniOptions")


def ray_head_open_to_every_namespace(plan: Plan) -> None:
    policy = _one(plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy", "job-identity-ray-head-ingress")
    policy["inputs"]["spec"]["ingress"].append({"from": [{"namespaceSelector": {}}], "ports": [{"port": 8265}]})


def _endpoint(*, internal_load_balancer: bool = False) -> dict[str, Any]:
    """The online endpoint's RayService as the program renders it with serve.enabled (infra/eks_serve.py)."""
    from infra.config import decode_pulumi_values, load_stack_config
    from infra.eks_serve import rayservice_manifest
    from infra.ops.stacks import read_stack_config

    overrides = {
        "serve.enabled": True,
        "eks.head_instance_type": "m5.2xlarge",
        "serve.internal_load_balancer": internal_load_balancer,
    }
    values, _ = read_stack_config("large", overrides)
    return rayservice_manifest(
        load_stack_config("large", decode_pulumi_values(values)), "large", "r/w:1", api_keys_secret_arn=KEYS_ARN
    )


def endpoint_on_internet_load_balancer(plan: Plan) -> None:
    manifest = _endpoint(internal_load_balancer=True)
    manifest["spec"]["serveService"]["metadata"]["annotations"] = {}  # the internal scheme forgotten
    _new(plan, _one(plan, "kubernetes:core/v1:ServiceAccount"), "kubernetes:ray.io/v1:RayService", "endpoint", manifest)


def endpoint_worker_privileged(plan: Plan) -> None:
    manifest = _endpoint()
    worker = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    worker["containers"][0]["securityContext"] = {"privileged": True}
    _new(plan, _one(plan, "kubernetes:core/v1:ServiceAccount"), "kubernetes:ray.io/v1:RayService", "endpoint", manifest)


def ray_ports_opened_to_the_vpc(plan: Plan) -> None:
    """The Serve port's VPC rule copied onto GCS: the VPC may reach the Serve port, never Ray's own."""
    policy = _one(plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy", "job-identity-ray-head-ingress")
    policy["inputs"]["spec"]["ingress"].append(
        {"from": [{"ipBlock": {"cidr": "10.40.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 6379}]}
    )


def _interface_endpoint(plan: Plan, name: str, policy: dict[str, Any] | None) -> None:
    """An interface endpoint as `network.interface_endpoints` adds one (none by default since issue 40)."""
    s3 = _one(plan, "aws:ec2/vpcEndpoint:VpcEndpoint", "network-s3")
    inputs = {
        "serviceName": "com.amazonaws.us-east-1.sts",
        "vpcEndpointType": "Interface",
        "vpcId": s3["inputs"]["vpcId"],
    }
    if policy is not None:
        inputs["policy"] = json.dumps(policy)
    _new(plan, s3, "aws:ec2/vpcEndpoint:VpcEndpoint", name, inputs)


def endpoint_without_policy(plan: Plan) -> None:
    _interface_endpoint(plan, "network-ecr-dkr", None)


def endpoint_policy_for_any_account(plan: Plan) -> None:
    statement = {"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*"}
    statement["Condition"] = {"StringLike": {"aws:PrincipalAccount": "*"}}
    _interface_endpoint(plan, "network-sts", {"Version": "2012-10-17", "Statement": [statement]})


def s3_endpoint_off_a_node_route_table(plan: Plan) -> None:
    """The nodes' second zone would fetch models and data through the NAT instance (and pay for it)."""
    endpoint = _one(plan, "aws:ec2/vpcEndpoint:VpcEndpoint", "network-s3")
    endpoint["inputs"]["routeTableIds"] = endpoint["inputs"]["routeTableIds"][:1]


def nat_instance_open_to_the_internet(plan: Plan) -> None:
    group = _one(plan, "aws:ec2/securityGroup:SecurityGroup", "network-nat")
    group["inputs"]["ingress"][0]["cidrBlocks"] = ["0.0.0.0/0"]


def nat_instance_forwards_another_port(plan: Plan) -> None:
    group = _one(plan, "aws:ec2/securityGroup:SecurityGroup", "network-nat")
    group["inputs"]["egress"].append({"protocol": "tcp", "fromPort": 80, "toPort": 80, "cidrBlocks": ["0.0.0.0/0"]})


def imds_v1_on_the_nat_instance(plan: Plan) -> None:
    _one(plan, "aws:ec2/instance:Instance", "network-nat-0")["inputs"]["metadataOptions"]["httpTokens"] = "optional"


def ssh_key_on_the_nat_instance(plan: Plan) -> None:
    _one(plan, "aws:ec2/instance:Instance", "network-nat-1")["inputs"]["keyName"] = "ops-laptop"


def public_node_takes_inbound(plan: Plan) -> None:
    """From inside the VPC only, so `security-groups` lets it be; but the small tier's node has a public address."""
    group = _one(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")
    group["inputs"]["ingress"] = [{"protocol": "tcp", "fromPort": 8265, "toPort": 8265, "cidrBlocks": ["10.40.0.0/16"]}]


def default_route_through_a_peering(plan: Plan) -> None:
    table = _one(plan, "aws:ec2/routeTable:RouteTable", "network-private-0")
    table["inputs"]["routes"] = [{"cidrBlock": "0.0.0.0/0", "vpcPeeringConnectionId": "pcx-0123456789abcdef0"}]


def eks_nodes_in_the_public_subnets(plan: Plan) -> None:
    public = [item["id"] for item in plan if item["type"] == "aws:ec2/subnet:Subnet" and "public" in item["name"]]
    _one(plan, "eks:index:ManagedNodeGroup", "nodes-system")["inputs"]["subnetIds"] = public


def ray_dashboard_on_internet_ingress(plan: Plan) -> None:
    account = _one(plan, "kubernetes:core/v1:ServiceAccount")
    ingress = {
        "metadata": {
            "name": "ray",
            "namespace": "llm-batch",
            "annotations": {"alb.ingress.kubernetes.io/scheme": "internet-facing"},
        },
        "spec": {"ingressClassName": "alb"},
    }
    _new(plan, account, "kubernetes:networking.k8s.io/v1:Ingress", "ray", ingress)


def lambda_permission_for_everyone(plan: Plan) -> None:
    function = _one(plan, "aws:lambda/function:Function", "cost-report")
    inputs = {"action": "lambda:InvokeFunction", "function": function["id"], "principal": "*"}
    _new(plan, function, "aws:lambda/permission:Permission", "invoke-anyone", inputs)


def layer_permission_for_everyone(plan: Plan) -> None:
    function = _one(plan, "aws:lambda/function:Function", "cost-report")
    inputs = {"action": "lambda:GetLayerVersion", "layerName": "deps", "versionNumber": 1, "principal": "*"}
    _new(plan, function, "aws:lambda/layerVersionPermission:LayerVersionPermission", "layer-anyone", inputs)


def public_eks_endpoint_without_cidrs(plan: Plan) -> None:
    _one(plan, "eks:index:Cluster")["inputs"]["endpointPublicAccess"] = True


def public_eks_endpoint_split_internet(plan: Plan) -> None:
    cluster = _one(plan, "eks:index:Cluster")["inputs"]
    cluster.update(endpointPublicAccess=True, publicAccessCidrs=["0.0.0.0/1", "128.0.0.0/1"])


def key_policy_star_behind_irrelevant_condition(plan: Plan) -> None:
    statement = {
        "Sid": "DecryptForReaders",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": "kms:Decrypt",
        "Resource": "*",
        "Condition": {"Bool": {"aws:SecureTransport": "true"}},
    }
    _add_statement(plan, "aws:kms/key:Key", "kms-key", statement)


def topic_star_behind_wildcard_account(plan: Plan) -> None:
    statement = {
        "Sid": "AnyonePublishes",
        "Effect": "Allow",
        "Principal": "*",
        "Action": "sns:Publish",
        "Resource": "*",
        "Condition": {"StringLike": {"aws:PrincipalAccount": "*"}},
    }
    _add_statement(plan, "aws:sns/topicPolicy:TopicPolicy", "alerts-topic-policy", statement)


def irsa_trust_with_wildcard_subject(plan: Plan) -> None:
    def edit(doc: dict[str, Any]) -> None:
        condition = doc["Statement"][0]["Condition"]
        equals = condition.pop("StringEquals")
        sub = next(key for key in equals if key.endswith(":sub"))
        condition["StringLike"] = {sub: "system:serviceaccount:*"}
        condition["StringEquals"] = {key: value for key, value in equals.items() if key != sub}

    _edit_document(_one(plan, "aws:iam/role:Role", "job-identity-job-role"), "assumeRolePolicy", edit)


def cross_account_trust_without_external_id(plan: Plan) -> None:
    statement = {
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::999999999999:root"},
        "Action": "sts:AssumeRole",
    }
    _add_statement(plan, "aws:iam/role:Role", "cost-report-role", statement, key="assumeRolePolicy")


def queue_open_to_any_accounts_rules(plan: Plan) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["Statement"][0].pop("Condition")

    _edit_document(_one(plan, "aws:sqs/queuePolicy:QueuePolicy"), "policy", edit)


def key_serves_every_stacks_logs(plan: Plan) -> None:
    def edit(doc: dict[str, Any]) -> None:
        for statement in doc["Statement"]:
            if statement.get("Sid") == "CloudWatchLogs":
                condition = statement["Condition"]["ArnLike"]
                condition["kms:EncryptionContext:aws:logs:arn"] = (
                    f"arn:aws:logs:us-west-2:{ACCOUNT}:log-group:/llm-batch/*"
                )

    _edit_document(_one(plan, "aws:kms/key:Key", "kms-key"), "policy", edit)


def imds_v1_on_the_small_node(plan: Plan) -> None:
    _one(plan, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]["metadataOptions"]["httpTokens"] = "optional"


def ssh_open_to_the_world(plan: Plan) -> None:
    group = _one(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-node-sg")
    group["inputs"]["ingress"] = [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]


def bucket_policy_without_tls(plan: Plan) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["Statement"] = [s for s in doc["Statement"] if s.get("Sid") != "DenyInsecureTransport"]

    _edit_document(_one(plan, "aws:s3/bucketPolicy:BucketPolicy"), "policy", edit)


def untagged_topic(plan: Plan) -> None:
    _one(plan, "aws:sns/topic:Topic")["provider"] = None


def whole_service_in_job_policy(plan: Plan) -> None:
    statement = {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::llm-batch-small-data-*"}
    _add_statement(plan, "aws:iam/policy:Policy", "job-access-policy", statement)


def ssm_core_back_on_the_small_node(plan: Plan) -> None:
    attachment = copy.deepcopy(_one(plan, "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "gpu-node-job"))
    attachment.update(name="gpu-node-ssm", urn=attachment["urn"] + "-ssm")
    attachment["inputs"]["policyArn"] = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    plan.append(attachment)


def mutable_image_tags(plan: Plan) -> None:
    _one(plan, "aws:ecr/repository:Repository")["inputs"]["imageTagMutability"] = "MUTABLE"


# --- Ray's ports and token (issue 34: rule ray-isolation) ------------------------------------------------------


def nightly_workers_without_a_policy(plan: Plan) -> None:
    plan.remove(_one(plan, checks_ray.NETWORK_POLICY, "job-identity-ray-cluster-ingress"))


def ray_ports_open_to_another_namespace(plan: Plan) -> None:
    policy = _one(plan, checks_ray.NETWORK_POLICY, "job-identity-ray-cluster-ingress")
    other = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    policy["inputs"]["spec"]["ingress"].append({"from": [other]})


def ray_workers_open_to_the_vpc(plan: Plan) -> None:
    policy = _one(plan, checks_ray.NETWORK_POLICY, "job-identity-ray-cluster-ingress")
    policy["inputs"]["spec"]["ingress"].append({"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]})


def rayservice_without_the_token(plan: Plan) -> None:
    manifest = _endpoint()
    del manifest["spec"]["rayClusterConfig"]["authOptions"]
    _new(plan, _one(plan, "kubernetes:core/v1:ServiceAccount"), "kubernetes:ray.io/v1:RayService", "endpoint", manifest)


def rayjob_turning_the_token_off_in_its_head(plan: Plan) -> None:
    from infra.rules.k8s_manifests import night_objects

    (rayjob,) = [copy.deepcopy(obj) for obj in night_objects(plan) if obj["kind"] == "RayJob"]
    rayjob["metadata"]["name"] = "adhoc"
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"].append({"name": "RAY_AUTH_MODE", "value": "disabled"})
    _new(plan, _one(plan, "kubernetes:core/v1:ServiceAccount"), "kubernetes:ray.io/v1:RayJob", "adhoc", rayjob)


def kuberay_pinned_before_token_auth(plan: Plan) -> None:
    _one(plan, checks_ray.CHART, "kuberay-operator")["inputs"]["version"] = "1.4.2"


MUTATIONS = [
    Mutation("large", passrole_any_role_by_arn, "passrole", "karpenter-controller-policy"),
    Mutation("small", passrole_through_action_wildcard, "passrole", "job-access-policy"),
    Mutation("small", kms_admin_in_job_policy, "kms-admin", "job-access-policy"),
    Mutation("medium", job_decrypts_directly, "kms-via-service", "job-access-policy"),
    Mutation("small", bucket_as_bucket_v2, "buckets", "aws:s3/bucketV2:BucketV2 scratch"),
    Mutation("small", bucket_as_directory_bucket, "bucket-types", "DirectoryBucket fast"),
    Mutation("medium", hop_limit_two_on_eks_nodes, "node-metadata", "nodes-gpu-lt"),
    Mutation("large", hop_limit_two_on_karpenter_nodes, "node-metadata", "EC2NodeClass"),
    Mutation("large", ray_dashboard_on_internet_load_balancer, "k8s-exposure", "Service ray-dashboard"),
    Mutation("medium", ray_dashboard_on_internet_ingress, "k8s-exposure", "Ingress ray"),
    Mutation("medium", endpoint_on_internet_load_balancer, "k8s-exposure", "RayService endpoint"),
    Mutation("large", endpoint_worker_privileged, "pod-security", "RayService endpoint"),
    Mutation("medium", ray_ports_opened_to_the_vpc, "ray-network-policy", "job-identity-ray-head-ingress"),
    Mutation("medium", job_namespace_without_pod_security, "pod-security", "job-identity-namespace"),
    Mutation("large", debug_pod_with_host_path_in_job_namespace, "pod-security", "Pod debug"),
    Mutation("large", api_token_back_on_the_workers, "worker-identity", "job-identity-worker-service-account"),
    Mutation("medium", workers_bound_to_edit, "worker-identity", "RoleBinding workers-edit"),
    Mutation("medium", network_policy_enforcement_off, "ray-network-policy", "eks-cluster"),
    Mutation("large", ray_head_open_to_every_namespace, "ray-network-policy", "job-identity-ray-head-ingress"),
    Mutation("medium", endpoint_without_policy, "endpoint-policies", "network-ecr-dkr"),
    Mutation("large", endpoint_policy_for_any_account, "endpoint-policies", "network-sts"),
    Mutation("medium", s3_endpoint_off_a_node_route_table, "endpoint-policies", "ManagedNodeGroup "),
    Mutation("medium", nat_instance_open_to_the_internet, "egress-path", "network-nat-0"),
    Mutation("large", nat_instance_forwards_another_port, "egress-path", "network-nat-2"),
    Mutation("medium", imds_v1_on_the_nat_instance, "egress-path", "network-nat-0"),
    Mutation("large", ssh_key_on_the_nat_instance, "egress-path", "network-nat-1"),
    Mutation("small", public_node_takes_inbound, "egress-path", "gpu-node-group"),
    Mutation("medium", default_route_through_a_peering, "egress-path", "network-private-0"),
    Mutation("large", eks_nodes_in_the_public_subnets, "egress-path", "nodes-system"),
    Mutation("small", lambda_permission_for_everyone, "lambda-permissions", "invoke-anyone"),
    Mutation("small", layer_permission_for_everyone, "lambda-permissions", "layer-anyone"),
    Mutation("large", public_eks_endpoint_without_cidrs, "eks-endpoint", "eks-cluster"),
    Mutation("medium", public_eks_endpoint_split_internet, "eks-endpoint", "eks-cluster"),
    Mutation("small", key_policy_star_behind_irrelevant_condition, "resource-principals", "kms-key"),
    Mutation("large", topic_star_behind_wildcard_account, "resource-principals", "alerts-topic-policy"),
    Mutation("large", irsa_trust_with_wildcard_subject, "trust", "job-identity-job-role"),
    Mutation("small", cross_account_trust_without_external_id, "trust", "cost-report-role"),
    Mutation("large", queue_open_to_any_accounts_rules, "service-principals", "karpenter-interruptions-policy"),
    Mutation("large", key_serves_every_stacks_logs, "key-logs-scope", "kms-key"),
    Mutation("small", imds_v1_on_the_small_node, "launch-templates", "gpu-node-template"),
    Mutation("small", ssh_open_to_the_world, "security-groups", "gpu-node-sg"),
    Mutation("small", bucket_policy_without_tls, "buckets", "storage-bucket"),
    Mutation("small", untagged_topic, "cost-tags", "alerts-topic"),
    Mutation("small", whole_service_in_job_policy, "iam", "job-access-policy"),
    Mutation("small", ssm_core_back_on_the_small_node, "iam", "gpu-node-ssm"),
    Mutation("small", mutable_image_tags, "images", "image-repository"),
    Mutation("medium", eks_node_volume_on_aws_ebs_key, "volume-keys", "nodes-gpu-lt"),
    Mutation("large", karpenter_node_volume_on_aws_ebs_key, "volume-keys", "EC2NodeClass"),
    Mutation("large", key_policy_without_auto_scaling_role, "volume-keys", "nodes-system-lt"),
]


MUTATIONS += [
    Mutation("medium", nightly_workers_without_a_policy, "ray-isolation", "RayJob llm-batch-"),
    Mutation("large", ray_ports_open_to_another_namespace, "ray-isolation", "job-identity-ray-cluster-ingress"),
    Mutation("medium", ray_workers_open_to_the_vpc, "ray-isolation", "job-identity-ray-cluster-ingress"),
    Mutation("large", rayservice_without_the_token, "ray-isolation", "RayService endpoint"),
    Mutation("medium", rayjob_turning_the_token_off_in_its_head, "ray-isolation", "RayJob adhoc"),
    Mutation("large", kuberay_pinned_before_token_auth, "ray-isolation", "Chart kuberay-operator"),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: f"{m.stack}-{m.mistake.__name__}")
def test_mutation_is_caught_by_its_rule(features_on: Callable[[str], Plan], mutation: Mutation) -> None:
    assert_caught(mutation, features_on)


def test_every_security_rule_is_tripped_by_a_mutation() -> None:
    """Here, in tests/infra/test_added_resource_mutations.py (mistakes added as new resources, every tier), in
    tests/infra/test_batch_api_component.py (the Batch API's front, on a plan that has one) or in
    tests/infra/test_review_mutations.py (the security review's findings)."""
    from tests.infra.test_added_resource_mutations import ADDED, EDITS
    from tests.infra.test_batch_api_component import MUTATIONS as FRONT_MUTATIONS
    from tests.infra.test_review_mutations import MUTATIONS as REVIEW_MUTATIONS

    rules = {*checks_iam.RULES, *checks_network.RULES, *checks_k8s.RULES, *checks_ray.RULES}
    rules |= {
        *checks_stores.RULES,
        *checks_credentials.RULES,
        *checks_egress.RULES,
        *checks_egress_path.RULES,
        *checks_batch_api.RULES,
        *checks_cross_account.RULES,
    }
    classic = {"cost-tags", "buckets", "iam", "launch-templates", "security-groups", "images", "volume-keys"}
    tripped = {mutation.rule for mutation in [*MUTATIONS, *ADDED, *EDITS, *REVIEW_MUTATIONS]}
    tripped |= {rule for _, rule, _ in FRONT_MUTATIONS}
    assert (rules | classic) - tripped == set()
