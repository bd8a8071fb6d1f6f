"""The KubeRay operator (pinned Helm chart): turns each night's RayJob into a Ray cluster, then nothing."""

from __future__ import annotations

import pulumi

from infra.components.helm import namespace, pinned_chart
from infra.k8s.common import POOL_LABEL, SYSTEM_POOL
from infra.k8s.head_group import KUBERAY_OPERATOR

OPERATOR_NAMESPACE = "kuberay-system"


class KubeRayOperator(pulumi.ComponentResource):
    """The operator on the on-demand head nodes; it watches RayJobs and RayClusters in every namespace."""

    def __init__(
        self, name: str, provider: pulumi.ProviderResource, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llmbatch:kuberay:KubeRayOperator", name, None, opts)
        ns = namespace(f"{name}-namespace", OPERATOR_NAMESPACE, pulumi.ResourceOptions(parent=self, provider=provider))
        self.chart = pinned_chart(
            f"{name}-operator",
            "kuberay-operator",
            OPERATOR_NAMESPACE,
            {
                "nodeSelector": {POOL_LABEL: SYSTEM_POOL},
                "resources": {
                    "requests": KUBERAY_OPERATOR.as_dict(),
                    "limits": {"cpu": "500m", "memory": KUBERAY_OPERATOR.memory},
                },
            },
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[ns]),
        )
        self.register_outputs({})
