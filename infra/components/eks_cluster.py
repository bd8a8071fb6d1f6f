"""The EKS control plane of the medium and large tiers, through pulumi-eks.

Private API endpoint by default (a config list of CIDRs can open it), secrets envelope-encrypted with the
stack's KMS key, control-plane logs on, access managed by EKS access entries (no aws-auth ConfigMap), and an
OIDC provider for IRSA. Nodes are added by `NodeGroups` and Karpenter; this component adds none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

CONTROL_PLANE_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
# Namespace-scoped edit rights: enough to create a night's ConfigMap and RayJob, nothing cluster-wide.
EDIT_POLICY = "arn:{partition}:eks::aws:cluster-access-policy/AmazonEKSEditPolicy"


@dataclass(frozen=True)
class EksClusterArgs:
    cluster_name: str
    version: str
    vpc_id: pulumi.Input[str]
    private_subnet_ids: pulumi.Input[Sequence[str]]
    key_arn: pulumi.Input[str]
    partition: str
    public_access_cidrs: Sequence[str] = ()
    # What happens at the end of the version's standard support (llm-batch:eks.support_type): STANDARD, AWS
    # upgrades the cluster; EXTENDED, it is billed extended support. Set explicitly: EKS's default is EXTENDED.
    support_type: str = "STANDARD"
    # Roles (e.g. the nightly submitter's) that may create jobs in `job_namespace` from inside the VPC.
    submitter_role_arns: Sequence[pulumi.Input[str]] = ()
    job_namespace: str = "llm-batch"
    tags: dict[str, str] = field(default_factory=dict)
    # The control-plane log group's retention (monitoring.log_retention_days) and its name (EKS fixes it).
    log_retention_days: int = 30
    log_group_name: str = ""


def endpoint_of(kubeconfig_json: str) -> str:
    """The API server URL written in a kubeconfig (pulumi-eks's, one cluster)."""
    document = json.loads(kubeconfig_json)
    return str(document["clusters"][0]["cluster"]["server"])


class EksCluster(pulumi.ComponentResource):
    """Outputs: name, endpoint, OIDC provider, security groups, and a Kubernetes provider for the cluster."""

    cluster: eks.Cluster
    cluster_name: str
    endpoint: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]
    oidc_provider_url: pulumi.Output[str]
    cluster_security_group_id: pulumi.Output[str]
    submitter_security_group_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:eks_cluster:EksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        public = list(args.public_access_cidrs)
        self.cluster_name = args.cluster_name
        # Declared before the cluster, so EKS finds it instead of creating its own: on the stack key, with the
        # stack's retention, deleted by `pulumi destroy` (an EKS-made group has no retention and outlives the stack).
        control_plane_logs = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=args.log_group_name or f"/aws/eks/{args.cluster_name}/cluster",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.key_arn,
            tags=args.tags,
            opts=child,
        )
        self.cluster = eks.Cluster(
            f"{name}-cluster",
            name=args.cluster_name,
            version=args.version,
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=args.support_type),
            vpc_id=args.vpc_id,
            private_subnet_ids=args.private_subnet_ids,
            node_associate_public_ip_address=False,
            endpoint_private_access=True,
            endpoint_public_access=bool(public),
            public_access_cidrs=public or None,
            authentication_mode=eks.AuthenticationMode.API,
            create_oidc_provider=True,
            # The vpc-cni addon enforces NetworkPolicy objects (Ray's head policy among them); off, they are
            # stored and ignored.
            vpc_cni_options=eks.VpcCniOptionsArgs(enable_network_policy=True),
            encryption_config_key_arn=args.key_arn,
            enabled_cluster_log_types=CONTROL_PLANE_LOGS,
            # Nodes come from launch templates this program declares (NodeGroups) and from Karpenter.
            skip_default_node_group=True,
            # Nodes then share the security group EKS itself creates for the control plane (managed groups
            # and Karpenter alike), and `cluster_security_group_id` is that group.
            skip_default_security_groups=True,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[control_plane_logs]),
        )
        self.kubeconfig = pulumi.Output.secret(self.cluster.kubeconfig_json)
        self.endpoint = self.cluster.kubeconfig_json.apply(endpoint_of)
        self.oidc_provider_arn = self.cluster.oidc_provider_arn
        self.oidc_provider_url = self.cluster.oidc_provider_url
        self.cluster_security_group_id = self.cluster.cluster_security_group_id

        # Whoever submits jobs from inside the VPC (the nightly run) wears this group; the API admits it.
        submitter = aws.ec2.SecurityGroup(
            f"{name}-submitter",
            vpc_id=args.vpc_id,
            description=f"{args.cluster_name}: job submitters inside the VPC (HTTPS to the API server only)",
            egress=[
                aws.ec2.SecurityGroupEgressArgs(
                    protocol="tcp",
                    from_port=443,
                    to_port=443,
                    cidr_blocks=["0.0.0.0/0"],
                    description="HTTPS to the EKS API and AWS endpoints",
                )
            ],
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-api-from-submitter",
            security_group_id=self.cluster_security_group_id,
            referenced_security_group_id=submitter.id,
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            description="Job submitters reach the private API endpoint",
            opts=child,
        )
        self.submitter_security_group_id = submitter.id
        for index, role_arn in enumerate(args.submitter_role_arns):
            entry = aws.eks.AccessEntry(
                f"{name}-submitter-{index}",
                cluster_name=args.cluster_name,
                principal_arn=role_arn,
                type="STANDARD",
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cluster]),
            )
            aws.eks.AccessPolicyAssociation(
                f"{name}-submitter-{index}-edit",
                cluster_name=args.cluster_name,
                principal_arn=role_arn,
                policy_arn=EDIT_POLICY.format(partition=args.partition),
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(
                    type="namespace", namespaces=[args.job_namespace]
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]),
            )

        self.provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=self.kubeconfig, enable_server_side_apply=True, opts=child
        )
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "endpoint": self.endpoint,
                "oidc_provider_arn": self.oidc_provider_arn,
                "submitter_security_group_id": self.submitter_security_group_id,
            }
        )
