"""The Ray clusters' NetworkPolicies as resources: one per (suffix, policy name, spec), in the job's namespace.

The specs come from infra/k8s/network_policy.py; the nightly RayJob (job_identity) and the RayService (serving)
declare theirs the same way, so the names and labels the policy gate reads cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.k8s.common import base_labels


def declare_network_policies(
    name: str,
    namespace: str,
    policies: Mapping[str, tuple[str, pulumi.Input[dict[str, Any]]]],
    opts: pulumi.ResourceOptions,
) -> None:
    for suffix, (policy_name, spec) in policies.items():
        k8s.networking.v1.NetworkPolicy(
            f"{name}-{suffix}",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=policy_name, namespace=namespace, labels=base_labels("network-policy")
            ),
            spec=spec,
            opts=opts,
        )
