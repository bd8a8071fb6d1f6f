"""The online endpoint's own identity in the cluster (issue 60): the RayService's head and workers run as service
accounts of their own, whose IRSA roles carry the job's policy (the model, the image, logs, metrics: what a
replica needs, as the job does) plus the one thing the job must not have, reading the endpoint's API keys.

Before, the replicas ran as the nightly job's accounts, so the job's pods (and on the small tier the GPU node's
instance role) could read the keys; now the job's policy names no key secret (infra/components/foundation.py).
The head's account is the one KubeRay binds to its autoscaler Role; the workers' mounts no Kubernetes API token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.components import irsa
from infra.eks_serve import SERVICE_ACCOUNT, WORKER_SERVICE_ACCOUNT
from infra.k8s.common import WORKER_COMPONENT, base_labels


def keys_policy(keys_secret_arn: str) -> str:
    """The replicas' read of the endpoint's keys (re-read every 30 s, workload/auth/keys.py); the stack key's use
    through Secrets Manager is the job policy's `UseStackKey`."""
    statement = {
        "Sid": "ReadServeApiKeys",
        "Effect": "Allow",
        "Action": ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
        "Resource": keys_secret_arn,
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


@dataclass(frozen=True)
class ServeIdentityArgs:
    namespace: str
    job_policy_arn: pulumi.Input[str]
    keys_secret_arn: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]


class ServeIdentity(pulumi.ComponentResource):
    """The two service accounts (`SERVICE_ACCOUNT`, `WORKER_SERVICE_ACCOUNT`) and their roles."""

    def __init__(
        self,
        name: str,
        args: ServeIdentityArgs,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmbatch:serve_identity:ServeIdentity", name, None, opts)
        policy = pulumi.Output.from_input(args.keys_secret_arn).apply(keys_policy)
        for suffix, account, labels, token in (
            ("head", SERVICE_ACCOUNT, base_labels("serve"), None),
            ("worker", WORKER_SERVICE_ACCOUNT, base_labels(WORKER_COMPONENT), False),
        ):
            role = irsa.service_account_role(
                f"{name}-{suffix}",
                oidc_provider_arn=args.oidc_provider_arn,
                oidc_provider_url=args.oidc_provider_url,
                namespace=args.namespace,
                service_account=account,
                policy=policy,
                policy_arns=[args.job_policy_arn],
                parent=self,
            )
            k8s.core.v1.ServiceAccount(
                f"{name}-{suffix}-service-account",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=account,
                    namespace=args.namespace,
                    labels=labels,
                    annotations={"eks.amazonaws.com/role-arn": role.arn},
                ),
                automount_service_account_token=token,
                opts=pulumi.ResourceOptions(parent=self, provider=provider),
            )
        self.register_outputs({})
