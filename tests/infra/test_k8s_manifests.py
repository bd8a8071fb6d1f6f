"""The manifests the outside checkers read (infra/rules/k8s_manifests.py): every Kubernetes object of a stack's
plan and of the night's run, and every pod template inside a custom resource written out as a Pod.

checkov itself runs over these in tests/infra/test_outside_checkers.py; here: nothing is missed, and a kind
the program does not make yet (a RayService, say) is covered without a list to update.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from infra.rules.k8s_manifests import as_pods, stack_manifests

Plan = list[dict[str, Any]]


def _kinds(manifests: list[dict[str, Any]]) -> list[str]:
    return [manifest["kind"] for manifest in manifests]


def test_the_small_tier_has_no_cluster_objects(plan_for: Callable[[str], Plan]) -> None:
    assert stack_manifests(plan_for("small")) == []


def test_every_kubernetes_object_of_the_plan_and_the_night_is_exported(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("large")
    declared = [item for item in plan if item.get("custom") and item["type"].startswith("kubernetes:")]
    manifests = stack_manifests(plan)
    # Each object the plan declares, by kind and name, plus the night's ConfigMap and RayJob.
    exported = {(m["kind"], m["metadata"].get("name")) for m in manifests}
    assert {(item["inputs"]["kind"], item["inputs"]["metadata"]["name"]) for item in declared} <= exported
    assert {"EC2NodeClass", "NodePool", "NetworkPolicy", "ClusterRole", "RayJob", "ConfigMap"} <= set(_kinds(manifests))
    # Numbers as YAML carries them, not the mocks' floats.
    policies = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "NetworkPolicy"}
    head = policies["ray-nightly-head-ingress"]
    assert {port["port"] for rule in head["spec"]["ingress"] for port in rule.get("ports", [])} == {8265}
    assert all(isinstance(port["port"], int) for rule in head["spec"]["ingress"] for port in rule["ports"])


def test_the_rayjobs_pod_templates_become_pods_in_its_namespace(plan_for: Callable[[str], Plan]) -> None:
    manifests = stack_manifests(plan_for("medium"))
    (rayjob,) = [m for m in manifests if m["kind"] == "RayJob"]
    pods = {pod["metadata"]["annotations"]["llm-batch.io/template-of"]: pod for pod in as_pods(rayjob)}
    assert set(pods) == {
        "spec.submitterPodTemplate",
        "spec.rayClusterSpec.headGroupSpec.template",
        "spec.rayClusterSpec.workerGroupSpecs[0].template",
    }
    worker = pods["spec.rayClusterSpec.workerGroupSpecs[0].template"]
    assert worker["spec"] == rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["metadata"]["namespace"] == rayjob["metadata"]["namespace"]
    assert worker["metadata"]["name"] == "rayjob-llm-batch-2026-11-29-rayclusterspec-workergroupspecs-0-template"
    assert [m for m in manifests if m["kind"] == "Pod"] == list(pods.values())


def test_a_new_custom_resource_with_pods_is_covered_without_a_list(plan_for: Callable[[str], Plan]) -> None:
    """A RayService (or any CRD holding pod templates) added to the plan is exported, its templates as Pods;
    a Deployment's template is left in place, where checkers read it."""
    plan = copy.deepcopy(plan_for("medium"))
    (head,) = [m for m in stack_manifests(plan) if m["kind"] == "Pod" and "headgroupspec" in m["metadata"]["name"]]
    template = {"metadata": {"labels": {"app": "serve"}}, "spec": head["spec"]}
    namespace = next(item for item in plan if item["type"] == "kubernetes:core/v1:Namespace")
    for kind, spec in (
        ("RayService", {"rayClusterConfig": {"headGroupSpec": {"template": template}}}),
        ("Deployment", {"template": template}),
    ):
        plan.append(
            {
                **copy.deepcopy(namespace),
                "type": f"kubernetes:example/v1:{kind}",
                "name": kind.lower(),
                "inputs": {
                    "apiVersion": "example/v1",
                    "kind": kind,
                    "metadata": {"name": "llm", "namespace": "llm-batch"},
                    "spec": spec,
                },
            }
        )
    manifests = stack_manifests(plan)
    assert {"RayService", "Deployment"} <= set(_kinds(manifests))
    (serve_pod,) = [m for m in manifests if m["kind"] == "Pod" and m["metadata"]["name"].startswith("rayservice")]
    assert serve_pod["metadata"]["name"] == "rayservice-llm-rayclusterconfig-headgroupspec-template"
    assert serve_pod["metadata"]["labels"] == {"app": "serve"}
    assert not [m for m in manifests if m["kind"] == "Pod" and m["metadata"]["name"].startswith("deployment")]
