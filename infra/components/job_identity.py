"""The job's identity in the cluster: its namespace, its service accounts and the IAM roles behind them (IRSA).

Each role carries the one job policy every tier uses (`JobAccess`: its bucket prefixes, key, secrets, log
group, image and metrics namespace), and only its own service account in the job's namespace can assume it.
The head and the GPU workers have separate accounts: KubeRay binds the head's to the autoscaler's Role, while
the workers' account has no Kubernetes rights and mounts no API token (its IRSA token is projected regardless).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.components import irsa
from infra.components.kuberay import OPERATOR_NAMESPACE
from infra.components.network_policies import declare_network_policies
from infra.k8s.common import WORKER_COMPONENT, base_labels, pod_security_labels
from infra.k8s.network_policy import ray_cluster_ingress, ray_head_ingress


@dataclass(frozen=True)
class JobIdentityArgs:
    namespace: str
    service_account: str
    worker_service_account: str
    job_policy_arn: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    # The nightly RayJob's cluster label (infra.eks_job.RAYJOB_NAME): what its NetworkPolicies select.
    nightly_cluster: str = "llm-batch"


class JobIdentity(pulumi.ComponentResource):
    """Namespace, service account annotated with its role, and the role."""

    role_arn: pulumi.Output[str]
    namespace: k8s.core.v1.Namespace  # what objects in the job's namespace wait for

    def __init__(
        self,
        name: str,
        args: JobIdentityArgs,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmbatch:job_identity:JobIdentity", name, None, opts)
        role = irsa.service_account_role(
            f"{name}-job",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace=args.namespace,
            service_account=args.service_account,
            policy_arns=[args.job_policy_arn],
            parent=self,
        )
        self.namespace = namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.namespace, labels={**base_labels("namespace"), **pod_security_labels()}
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.service_account,
                namespace=args.namespace,
                labels=base_labels("job"),
                annotations={"eks.amazonaws.com/role-arn": role.arn},
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace]),
        )
        worker_role = irsa.service_account_role(
            f"{name}-worker",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace=args.namespace,
            service_account=args.worker_service_account,
            policy_arns=[args.job_policy_arn],
            parent=self,
        )
        k8s.core.v1.ServiceAccount(
            f"{name}-worker-service-account",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.worker_service_account,
                namespace=args.namespace,
                labels=base_labels(WORKER_COMPONENT),
                annotations={"eks.amazonaws.com/role-arn": worker_role.arn},
            ),
            automount_service_account_token=False,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace]),
        )
        # Ray runs code with the job's role for whoever reaches its ports: the nightly cluster's pods admit only
        # each other, and its head the submitter and the operator on the job API (infra/k8s/network_policy.py).
        policies = {
            "ray-cluster-ingress": ("ray-nightly-ingress", ray_cluster_ingress(args.nightly_cluster)),
            "ray-head-ingress": (
                "ray-nightly-head-ingress",
                ray_head_ingress(args.nightly_cluster, OPERATOR_NAMESPACE, submitter=True),
            ),
        }
        declare_network_policies(
            name,
            args.namespace,
            policies,
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace]),
        )
        self.role_arn = role.arn
        self.register_outputs({"role_arn": self.role_arn})
