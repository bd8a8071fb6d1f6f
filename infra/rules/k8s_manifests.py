"""Every Kubernetes object a stack's plan creates, as the plain manifests outside checkers read (checkov).

Two sources, both walked generically so a new object kind is covered without a list to keep up to date:
- every custom `kubernetes:*` resource of the plan (namespaces, service accounts, RBAC, NetworkPolicy,
  Karpenter's EC2NodeClass and NodePool, any RayService or other custom resource): its inputs are the
  manifest Pulumi applies;
- the objects each night's run submits (ConfigMap and RayJob), rendered from the program's `rayjob_args`
  export exactly as the nightly submitter renders them (`infra.eks_job.manifests_for_date`).

Checkers know Pods and the built-in workloads, not custom resources, so every pod template found inside a
custom resource (a RayJob's head and worker groups and its submitter, a RayService's cluster, ...) is also
written out as a Pod in the owner's namespace. Helm charts' objects are not in the plan (Helm renders them at
deploy time), so they are not covered here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from infra.eks_job import manifests_for_date
from infra.k8s.common import Manifest
from infra.k8s.rayjob import RayJobArgs
from infra.rules.plan_view import Plan

# Any UTC date: the night's objects differ between nights only in names and URIs.
SAMPLE_NIGHT = "2026-11-29"
# Kinds whose pod template checkers already read in place; a template anywhere else is written out as a Pod.
BUILT_IN_POD_OWNERS = frozenset(
    {"Pod", "PodTemplate", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController"}
    | {"Job", "CronJob"}
)


def _plain(value: Any) -> Any:
    """The value as YAML would carry it: Pulumi's mocks hand numbers back as floats (8265.0 -> 8265)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def plan_objects(plan: Plan) -> list[Manifest]:
    """The manifest of every Kubernetes object the plan declares (its inputs, as Pulumi applies them)."""
    return [
        _plain(dict(item["inputs"]))
        for item in plan
        if item.get("custom")
        and item["type"].startswith("kubernetes:")
        and "kind" in item["inputs"]
        and "apiVersion" in item["inputs"]
    ]


def night_objects(plan: Plan) -> list[Manifest]:
    """What one night's run submits on the EKS tiers (none on a tier without the `rayjob_args` export)."""
    stacks = [item for item in plan if item["type"] == "pulumi:pulumi:Stack"]
    exported = (stacks[0].get("outputs") or {}).get("rayjob_args") if stacks else None
    if not exported:
        return []
    return manifests_for_date(RayJobArgs.model_validate_json(exported), SAMPLE_NIGHT)


def pod_templates(value: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, template) for every pod template inside a manifest: any object whose `spec` lists containers."""
    if isinstance(value, dict):
        spec = value.get("spec")
        if path and isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            yield path, value
            return
        for key, item in value.items():
            yield from pod_templates(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from pod_templates(item, f"{path}[{index}]")


def _slug(text: str) -> str:
    """A DNS subdomain from a path: `rayjob-x-spec.workerGroupSpecs[0].template` -> `rayjob-x-...-0-template`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def as_pods(manifest: Manifest) -> list[Manifest]:
    """Each pod template inside a custom resource, as the Pod it becomes (named after owner and path)."""
    if manifest.get("kind") in BUILT_IN_POD_OWNERS:
        return []
    metadata = manifest.get("metadata") or {}
    owner = f"{manifest.get('kind', 'object')}-{metadata.get('name', 'unnamed')}".lower()
    pods = []
    for path, template in pod_templates(manifest):
        template_metadata = dict(template.get("metadata") or {})
        pod_metadata = {
            **template_metadata,
            "name": _slug(f"{owner}-{path.removeprefix('spec.')}")[:253],
            "annotations": {**(template_metadata.get("annotations") or {}), "llm-batch.io/template-of": path},
        }
        if "namespace" in metadata:
            pod_metadata["namespace"] = metadata["namespace"]
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": template["spec"]})
    return pods


def stack_manifests(plan: Plan) -> list[Manifest]:
    """Every object the stack creates in its cluster, then every pod template in them written out as a Pod."""
    objects = plan_objects(plan) + night_objects(plan)
    return objects + [pod for manifest in objects for pod in as_pods(manifest)]
