"""The NVIDIA device plugin (pinned Helm chart): makes each GPU node advertise `nvidia.com/gpu`.

Without it a GPU node has GPUs the scheduler cannot see and every Ray worker stays Pending.
"""

from __future__ import annotations

import pulumi

from infra.components.helm import pinned_chart
from infra.k8s.common import GPU8_POOL, GPU_POOL, POOL_LABEL, gpu_toleration


class NvidiaDevicePlugin(pulumi.ComponentResource):
    """A DaemonSet on the GPU pool only (managed group or Karpenter nodes: both carry the pool label)."""

    def __init__(
        self, name: str, provider: pulumi.ProviderResource, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llmbatch:device_plugin:NvidiaDevicePlugin", name, None, opts)
        self.chart = pinned_chart(
            f"{name}-chart",
            "nvidia-device-plugin",
            "kube-system",
            {
                # The chart's default affinity wants node-feature-discovery labels, which these nodes lack.
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": POOL_LABEL, "operator": "In", "values": [GPU_POOL, GPU8_POOL]}
                                    ]
                                }
                            ]
                        }
                    }
                },
                "tolerations": [gpu_toleration()],
                "priorityClassName": "system-node-critical",
            },
            pulumi.ResourceOptions(parent=self, provider=provider),
        )
        self.register_outputs({})
