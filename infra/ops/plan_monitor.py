"""The monitor a plan is recorded through: the SDK's mock monitor, keeping every registration (parent, provider,
inputs, dependencies, aliases) in order, and doing what the engine does to a request that the SDK's mock skips (run
the stack transforms, answer component method calls). `infra.ops.plan_mocks` answers for the provider.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from pulumi import ResourceOptions, ResourceTransformArgs
from pulumi.runtime import MockCallArgs, Mocks, rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.proto import provider_pb2
from pulumi.runtime.settings import get_project, get_stack
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from infra.rules.plan_view import SECRET_MASK


def mask_secrets(value: Any) -> Any:
    """The value with every Pulumi secret replaced by a mask: a plan never prints one."""
    if rpc.is_rpc_secret(value):
        return SECRET_MASK
    if isinstance(value, dict):
        return {key: mask_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mask_secrets(item) for item in value]
    return _plain_asset(value)


def _plain_asset(value: Any) -> Any:
    """Assets and archives as data (their repr holds a memory address, so plans would never compare equal)."""
    from pulumi import asset

    root = Path(__file__).resolve().parents[2]
    if isinstance(value, asset.AssetArchive):
        return {"archive": {name: _plain_asset(item) for name, item in sorted(value.assets.items())}}
    if isinstance(value, asset.FileAsset | asset.FileArchive):
        path = Path(str(value.path)).resolve()
        return {"file": str(path.relative_to(root)) if path.is_relative_to(root) else str(path)}
    if isinstance(value, asset.StringAsset):
        return {"text": value.text}
    return value


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    provider: str | None
    inputs: dict[str, Any]
    ignore_changes: list[str] = field(default_factory=list)
    remote: bool = False
    # What the engine makes it wait for: explicit `depends_on`, the resources whose outputs feed its inputs
    # (a component among them stands for its children) and its parent. Its provider is in `provider`.
    dependencies: list[str] = field(default_factory=list)
    # Which resources fed each input, by URN, as the engine hands them to a policy pack: rules join on these,
    # since ids are unknown until a real `up` has created the resource.
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    # Its `aliases` as the SDK sends them: `{"urn": ...}` or a spec (`name`, `type`, `parentUrn`, `noParent`, ...);
    # a resource moved under a new parent keeps its old URN through one (tests/infra/test_plan_urns.py).
    aliases: list[dict[str, Any]] = field(default_factory=list)
    id: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)


def _resource_refs_as_urns(struct: Any, found: set[str] | None = None) -> Any:
    """A copy of a registration's properties with each resource reference replaced by its URN (added to `found`).

    Deserialising a reference would look the resource up through the engine from the monitor's thread, which
    fails under mocks (pulumi/pulumi#6561); for the plan the URN says which resource it is.
    """
    from google.protobuf import json_format, struct_pb2

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if value.get(rpc._special_sig_key) == rpc._special_resource_sig:
                if found is not None and value.get("urn"):
                    found.add(str(value["urn"]))
                return value.get("urn", "")
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    plain = walk(json_format.MessageToDict(struct))
    copy = struct_pb2.Struct()
    copy.update(plain)
    return copy


def _dependencies(request: Any, references: set[str]) -> list[str]:
    """The URNs a registration waits on: what the SDK sends as `dependencies` and `propertyDependencies`, the
    resources its inputs reference (a remote component's inputs, e.g. a node group's `cluster`, leave
    references out of the dependency lists, yet serialising one waits for that resource), and its parent."""
    urns = set(request.dependencies) | references
    for property_dependencies in request.propertyDependencies.values():
        urns.update(property_dependencies.urns)
    if request.parent:
        urns.add(request.parent)
    return sorted(urns)


def _alias(alias: Any) -> dict[str, Any]:
    """One alias of a registration as plain data: a full URN, or the spec the engine turns into one."""
    if alias.HasField("urn"):
        return {"urn": alias.urn}
    return json_format.MessageToDict(alias.spec)


def _run_stack_transforms(transforms: list[Any], request: Any) -> None:
    """As the engine does before it registers a resource: each stack transform may rewrite its inputs.

    The SDK's mock monitor records stack transforms but runs none, so a plan would not show what they set (the
    permissions boundary of infra/role_boundary.py). Only the properties a transform changed are written back,
    so the rest of the request stays exactly as the program sent it.
    """
    if not transforms:
        return
    props = rpc.deserialize_properties(request.object)
    for transform in transforms:
        args = ResourceTransformArgs(
            custom=bool(request.custom),
            type_=request.type,
            name=request.name,
            props=props,
            opts=ResourceOptions(),
        )
        result = transform(args)
        if inspect.isawaitable(result):
            result = _sync_await(result)
        if result is None:
            continue
        changed = {key: value for key, value in result.props.items() if props.get(key) != value}
        if changed:
            serialized = _sync_await(rpc.serialize_properties(changed, {}))
            for key, value in serialized.fields.items():
                request.object.fields[key].CopyFrom(value)
        props = dict(result.props)


class RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, keeping each registration's parent, provider and inputs in order."""

    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.registrations: list[Registration] = []

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        """The URN the engine gives it: its type after the parent's whole type chain, none for the stack's children.

        The SDK's mock prefixes only the parent's last type, and the stack's own for top-level resources; a real
        `up` does neither, and a resource moved under a new parent must be checked against the URNs it really had.
        """
        if parent and parent.split("::")[2] != "pulumi:pulumi:Stack":
            type_ = parent.split("::")[2] + "$" + type_
        return "urn:pulumi:" + "::".join([get_stack(), get_project(), type_, name])

    def Call(self, request: Any) -> Any:
        """Method calls on components (pulumi_eks `Cluster.get_kubeconfig()`): the SDK's monitor has none."""
        _ensure_event_loop()
        # Plain JSON, not deserialize_properties: that would rebuild the `__self__` resource reference on this
        # executor thread's own event loop, which fails ("attached to a different loop", pulumi/pulumi#6561).
        args = json_format.MessageToDict(request.args)
        answer = self.mocks.call(MockCallArgs(token=request.tok, args=args, provider=request.provider))
        result = answer[0] if isinstance(answer, tuple) else answer  # Mocks.call may add a failure list
        returned = _sync_await(rpc.serialize_properties(result, {}))
        return provider_pb2.CallResponse(**{"return": returned})

    def RegisterResource(self, request: Any) -> Any:
        references: set[str] = set()
        request.object.CopyFrom(_resource_refs_as_urns(request.object, references))
        if request.type != "pulumi:pulumi:Stack":
            _run_stack_transforms(self._stack_transforms, request)
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        urn = self.make_urn(request.parent, request.type, request.name)
        state = self.resources[urn].state if urn in self.resources else {}
        has_state = bool(request.custom or request.remote)
        self.registrations.append(
            Registration(
                urn=urn,
                type=request.type,
                name=request.name,
                parent=request.parent or None,
                custom=bool(request.custom),
                # A provider reference is "<provider urn>::<provider id>".
                provider=request.provider.rsplit("::", 1)[0] if request.provider else None,
                inputs=mask_secrets(rpc.deserialize_properties(request.object)),
                ignore_changes=list(request.ignoreChanges),
                remote=bool(request.remote),
                dependencies=_dependencies(request, references),
                property_dependencies={
                    key: sorted(urns.urns) for key, urns in sorted(request.propertyDependencies.items()) if urns.urns
                },
                aliases=[_alias(alias) for alias in request.aliases],
                # Local components have no id or outputs of their own (the SDK's monitor mocks them anyway);
                # remote ones (pulumi_eks.Cluster, helm Chart) have outputs, and only those under mocks.
                id=self.resources[urn].id if has_state and urn in self.resources else None,
                outputs=mask_secrets(state) if has_state else {},
            )
        )
        return response
