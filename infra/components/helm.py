"""Pinned Helm charts: every chart's repository and version come from `infra.versions.HELM_CHARTS`."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import versions


def pinned_chart(
    name: str, chart: str, namespace: str, values: dict[str, Any], opts: pulumi.ResourceOptions
) -> k8s.helm.v4.Chart:
    """Chart `chart` at its pinned version, from an HTTP repository or an OCI registry."""
    try:
        repository, version = versions.HELM_CHARTS[chart]
    except KeyError:
        raise ValueError(f"chart {chart!r} is not pinned in infra/versions.py HELM_CHARTS") from None
    if repository.startswith("oci://"):
        return k8s.helm.v4.Chart(name, chart=repository, version=version, namespace=namespace, values=values, opts=opts)
    return k8s.helm.v4.Chart(
        name,
        chart=chart,
        version=version,
        namespace=namespace,
        repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo=repository),
        values=values,
        opts=opts,
    )


def namespace(name: str, namespace_name: str, opts: pulumi.ResourceOptions) -> k8s.core.v1.Namespace:
    return k8s.core.v1.Namespace(name, metadata=k8s.meta.v1.ObjectMetaArgs(name=namespace_name), opts=opts)
