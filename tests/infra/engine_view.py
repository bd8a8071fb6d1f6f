"""A plan's resources as the Pulumi engine hands them to a policy pack (`AnalyzeStack`), without the CLI.

One property bag per resource: after an `up` the engine sends each resource's outputs, which echo its inputs; the
plan's inputs are laid over its mock outputs, so a test that edits an input sees the edit, as a real `up` of the
edited program would. Every custom resource has a provider (the engine's default one where the program named
none), and so has a remote component; the parent is sent apart from the dependencies; `propertyDependencies`
are the URNs that fed each input. `engine_resources` gives them as the Python objects the pack's policies get
(pulumi_policy's PolicyResource, references resolved), `analyzer_resource` as the gRPC message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.rules.plan_view import Plan, Violation
from infra.rules.policy_stack import validate_stack
from infra.rules.registry import RULES


@dataclass(frozen=True)
class Ref:
    urn: str


@dataclass
class EngineResource:
    resource_type: str
    props: dict[str, Any]
    urn: str
    name: str
    provider: Ref | None
    parent: Ref | None
    dependencies: list[Ref] = field(default_factory=list)
    property_dependencies: dict[str, list[Ref]] = field(default_factory=dict)


def properties(item: Mapping[str, Any], echoed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The resource's property bag; `echoed` names the outputs that only echo an input (the inputs the captured
    plan had): a test that removes such an input removes its echo too, as a real `up` would."""
    outputs = {key: value for key, value in (item.get("outputs") or {}).items() if key not in echoed}
    props = {**outputs, **(item.get("inputs") or {})}
    if item.get("custom"):
        props["id"] = item.get("id")
    return props


def provider(item: Mapping[str, Any], stack: str) -> str | None:
    package = item["type"].split(":")[0]
    if item.get("provider") is None and (item.get("custom") or item.get("remote")) and package != "pulumi":
        return f"urn:pulumi:{stack}::llm-batch::pulumi:providers:{package}::default"
    return item.get("provider")


def dependencies(item: Mapping[str, Any]) -> list[str]:
    return [urn for urn in item.get("dependencies") or [] if urn != item.get("parent")]


def engine_resources(plan: Plan, stack: str, captured: Plan = ()) -> list[EngineResource]:
    """`plan` as the engine sends it; `captured`, the plan before a test edited it, says which outputs echo inputs."""
    inputs_of = {item["urn"]: frozenset(item.get("inputs") or {}) for item in captured}
    return [
        EngineResource(
            resource_type=item["type"],
            props=properties(item, inputs_of.get(item["urn"], frozenset())),
            urn=item["urn"],
            name=item["name"],
            provider=Ref(urn) if (urn := provider(item, stack)) else None,
            parent=Ref(item["parent"]) if item.get("parent") else None,
            dependencies=[Ref(urn) for urn in dependencies(item)],
            property_dependencies={
                key: [Ref(urn) for urn in urns] for key, urns in (item.get("property_dependencies") or {}).items()
            },
        )
        for item in plan
    ]


def pack_reports(rule: str, plan: Plan, stack: str, captured: Plan) -> list[str]:
    """What the pack's stack policy for `rule` reports over the edited `plan` as the engine would send it: the
    pack's own `validate` (policy_stack.validate_stack) called directly, without CrossGuard's gRPC server."""
    return validate_stack(RULES[rule], engine_resources(plan, stack, captured))


def gate_reports(rule: str, violations: Sequence[Violation]) -> list[str]:
    """The offline gate's violations of `rule` as the pack words them."""
    return [f"{violation.resource}: {violation.problem} (fix: {RULES[rule].fix})" for violation in violations]
