"""The rules as CrossGuard runs them: the engine's view of a stack (what `AnalyzeStack` hands a stack policy of
infra/policy_pack/) read as a plan, and each rule's verdict over it.

A real `pulumi preview` holds values nobody knows yet (a new bucket's id, a role's ARN). CrossGuard's own answer
is that a policy which reads one is not judged at preview: its SDK raises `UnknownValueError` on the read and
reports "can't run policy during preview" as advisory, and the policy runs on `up`, where every value is known.
The plan here keeps that rule: unknown values stay in it, and reading one raises `UnknownValue`, which the pack
turns into CrossGuard's error. As with CrossGuard's proxies, copying a dict (`dict(inputs)`, `{**inputs}`),
iterating a list, `in` on a list and `==` on a whole object read what they touch: an unknown cannot leave the
plan as a plain string and pass (or fail) a rule as if it were a value. (Two reads escape a Python-level
check, as they escape CrossGuard's: `json.dumps` and `str` of a list holding an unknown string print it.)

`preview_only(plan)` runs the same machinery over the offline plan as a first preview would show it
(`at_first_preview`: every value the mocks invent unknown, and every input built from one): the rules that
read one could only be judged on a real preview or up.

Imports no pulumi_policy (the dev virtualenv has none, see tools/locks.py): the pack hands its objects in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from infra.rules.plan_view import NothingMatched, Plan, Rule, tier_of

# pulumi_policy/proxy.py: what an unknown value of each kind is on the wire.
UNKNOWNS = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",  # boolean
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",  # number
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",  # string
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",  # array
        "030794c1-ac77-496b-92df-f27374a8bd58",  # asset
        "e48ece36-62e2-4504-bad9-02848725956a",  # archive
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",  # object
    }
)
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
# The remote components the program builds: the engine names a provider for them as for a custom resource, and
# the rules read them as components (`custom` false).
REMOTE_COMPONENTS = frozenset({"eks:index:Cluster", "eks:index:ManagedNodeGroup", "kubernetes:helm.sh/v4:Chart"})


class UnknownValue(Exception):
    """A rule read a value that is unknown until the resource exists."""

    def __init__(self, sentinel: str, path: list[str]) -> None:
        super().__init__(f"the value at {'.'.join(path)} can't be known during preview")
        self.sentinel = sentinel
        self.path = path


def _checked(value: Any, path: list[str]) -> Any:
    if isinstance(value, str) and value in UNKNOWNS:
        raise UnknownValue(value, path)
    return value


class _Known(dict[str, Any]):
    """A dict (so the rules' isinstance checks hold) whose reads raise UnknownValue on an unknown value."""

    def __init__(self, items: Mapping[str, Any], path: list[str]) -> None:
        super().__init__(items)
        self._path = path

    def __getitem__(self, key: str) -> Any:
        return _checked(super().__getitem__(key), [*self._path, str(key)])

    # Defined here, not inherited: a dict subclass with dict's own iterator is copied (`dict(x)`, `{**x}`) by
    # CPython straight from its storage, past __getitem__; with this one the copy reads each value.
    def __iter__(self) -> Iterator[str]:
        return dict.__iter__(self)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if dict.__contains__(self, key) else default

    def values(self) -> Any:
        return [self[key] for key in self]

    def items(self) -> Any:
        return [(key, self[key]) for key in self]

    def __eq__(self, other: object) -> bool:
        return dict(self.items()) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None


class _KnownList(list[Any]):
    def __init__(self, items: Sequence[Any], path: list[str]) -> None:
        super().__init__(items)
        self._path = path

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return _KnownList(super().__getitem__(index), self._path)
        return _checked(super().__getitem__(index), [*self._path, str(index)])

    def __iter__(self) -> Iterator[Any]:
        return (self[index] for index in range(len(self)))

    def __contains__(self, value: object) -> bool:
        return any(item == value for item in self)

    def __eq__(self, other: object) -> bool:
        return list(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None


def known(value: Any, path: list[str] | None = None) -> Any:
    """`value` as plain dicts and lists that raise UnknownValue on reading an unknown; CrossGuard's own proxies
    (Mappings and Sequences that check on read too) are unwrapped through their `__target`."""
    path = path or []
    if isinstance(value, Mapping):
        target = value if isinstance(value, dict) else value["__target"]
        return _Known({key: known(item, [*path, str(key)]) for key, item in dict.items(target)}, path)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        target = value if isinstance(value, list | tuple) else value["__target"]  # type: ignore[call-overload]
        return _KnownList([known(item, [*path, str(index)]) for index, item in enumerate(target)], path)
    return value


class Ref(Protocol):
    @property
    def urn(self) -> str: ...


class StackResource(Protocol):
    """What pulumi_policy's PolicyResource carries (the engine's AnalyzerResource, references resolved); read-only
    here, so any object with these attributes will do (tests/infra/engine_view.py builds them from a plan)."""

    @property
    def resource_type(self) -> str: ...
    @property
    def props(self) -> Any: ...
    @property
    def urn(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> Ref | None: ...
    @property
    def parent(self) -> Ref | None: ...
    @property
    def dependencies(self) -> Sequence[Ref]: ...
    @property
    def property_dependencies(self) -> Mapping[str, Sequence[Ref]]: ...


def _inside_remote(resources: Sequence[StackResource]) -> set[str]:
    """The URNs a remote component's provider registers under it, at any depth (pulumi-eks's own cluster, roles
    and security groups; a chart's objects). The mocks build none of them, so the offline gate judges the
    component's inputs alone; the pack leaves them out to judge the same resources."""
    by_urn = {resource.urn: resource for resource in resources}
    inside: set[str] = set()
    for resource in resources:
        parent = resource.parent.urn if resource.parent else None
        while parent is not None and parent in by_urn:
            if by_urn[parent].resource_type in REMOTE_COMPONENTS:
                inside.add(resource.urn)
                break
            ancestor = by_urn[parent].parent
            parent = ancestor.urn if ancestor else None
    return inside


def plan_of(resources: Sequence[StackResource]) -> list[dict[str, Any]]:
    """The engine's resources as plan items. The engine sends one property bag per resource (its outputs, which
    echo its inputs), so `inputs` and `outputs` are the same; `custom` is what has a provider (the engine gives
    every custom resource one, a default provider at least) or is one, less the remote components, which are
    `remote` as in the offline plan. `dependencies` holds the parent too, as the offline plan's does: the engine
    sends it apart, and a child is registered only once its parent is."""
    plan: list[dict[str, Any]] = []
    inside = _inside_remote(resources)
    for resource in resources:
        if resource.urn in inside:
            continue
        props = known(resource.props, [resource.urn])
        custom = resource.resource_type.startswith("pulumi:providers:") or (
            resource.provider is not None and resource.resource_type not in REMOTE_COMPONENTS
        )
        parent = resource.parent.urn if resource.parent else None
        item = {
            "urn": resource.urn,
            "type": resource.resource_type,
            "name": resource.name,
            "parent": parent,
            "custom": custom,
            "remote": resource.resource_type in REMOTE_COMPONENTS,
            "provider": resource.provider.urn if resource.provider else None,
            "inputs": props,
            "outputs": props,
            "id": dict.get(props, "id") if custom else None,
            "dependencies": sorted(
                {dependency.urn for dependency in resource.dependencies} | ({parent} if parent else set())
            ),
            "property_dependencies": {
                key: [dependency.urn for dependency in refs] for key, refs in resource.property_dependencies.items()
            },
        }
        plan.append(_Known(item, [resource.urn]))
    return plan


def verdict(rule: Rule, plan: Plan) -> list[str] | None:
    """One rule's violations over the plan as messages (`resource: problem`, or what it failed to find);
    None where the plan's tier is not the rule's. UnknownValue propagates: the caller says what it means."""
    tier = tier_of(plan)
    if tier is not None and tier not in rule.tiers:
        return None
    try:
        return [f"{violation.resource}: {violation.problem}" for violation in rule.check(plan)]
    except NothingMatched as error:
        return [str(error)]


def validate_stack(rule: Rule, resources: Sequence[StackResource]) -> list[str]:
    """What the pack's stack policy for `rule` reports over the engine's resources, one message per violation
    (`resource: problem (fix: ...)`); the pack's `validate` is this and CrossGuard's plumbing. UnknownValue
    propagates: the pack raises CrossGuard's UnknownValueError for it."""
    return [f"{message} (fix: {rule.fix})" for message in verdict(rule, plan_of(resources)) or []]


# Shorter invented strings ("true", a region) would match inputs that merely share the text.
_MIN_INVENTED = 8


def _invented(item: Mapping[str, Any]) -> set[str]:
    """The strings the mocks invent for a resource: its id and the outputs that do not echo an input. An id or
    output equal to one of its own inputs (a role's id is its name) is left out: a reference to it may be the
    known input."""
    inputs = item.get("inputs") or {}
    own = {value for value in inputs.values() if isinstance(value, str)}
    found = {
        value
        for key, value in (item.get("outputs") or {}).items()
        if isinstance(value, str) and inputs.get(key) != value and value not in own
    }
    if item.get("custom") and isinstance(item.get("id"), str) and item["id"] not in own:
        found.add(item["id"])
    return {value for value in found if len(value) >= _MIN_INVENTED}


def _unknown_where_derived(value: Any, invented: set[str]) -> Any:
    """`value` with each string that holds an invented value made unknown: at a first preview an input built
    from another resource's output (an ARN in a policy document, a cluster's name) is unknown as a whole."""
    if isinstance(value, dict):
        return {key: _unknown_where_derived(item, invented) for key, item in value.items()}
    if isinstance(value, list):
        return [_unknown_where_derived(item, invented) for item in value]
    if isinstance(value, str) and any(made in value for made in invented):
        return UNKNOWN
    return value


def at_first_preview(plan: Plan) -> list[dict[str, Any]]:
    """The offline plan as a first `pulumi preview` of the stack would show it, nothing created yet: every id
    and every output the mocks invent unknown (the sentinel strings), and so every input built from one of those
    (by the resources it waits for); outputs that echo an input are that input. The stack's exports stay as the
    program set them. Plain dicts: `known_plan` makes them raise on reading an unknown."""
    invented = {item["urn"]: _invented(item) for item in plan}
    unknowing: list[dict[str, Any]] = []
    for item in plan:
        feeders = set().union(*(invented.get(urn, set()) for urn in item.get("dependencies") or []))
        raw = item.get("inputs") or {}
        inputs = _unknown_where_derived(dict(raw), feeders)
        outputs = dict(item.get("outputs") or {})
        if item["type"] != "pulumi:pulumi:Stack":
            outputs = {key: inputs[key] if raw.get(key) == value else UNKNOWN for key, value in outputs.items()}
        unknowing.append({**item, "inputs": inputs, "id": UNKNOWN if item.get("custom") else None, "outputs": outputs})
    return unknowing


def known_plan(plan: Plan) -> list[dict[str, Any]]:
    """Plan items whose reads (the item's keys, inputs, outputs, at any depth) raise UnknownValue on an unknown."""
    return [
        _Known(
            {
                **item,
                "inputs": known(item.get("inputs") or {}, [item["urn"], "inputs"]),
                "outputs": known(item.get("outputs") or {}, [item["urn"], "outputs"]),
            },
            [item["urn"]],
        )
        for item in plan
    ]


def preview_only(plan: Plan, rules: Mapping[str, Rule]) -> dict[str, list[str]]:
    """{rule: the path of the first unknown value it read (the resource's URN, then the keys)} for each rule
    that reads, in `at_first_preview(plan)`, a value unknown until the resources exist: the offline verdict
    rests on what the mocks invented, and the pack can only judge that rule once the engine knows the value
    (on `up`, or on a preview of a stack whose resources exist and do not change)."""
    unknowing = known_plan(at_first_preview(plan))
    found: dict[str, list[str]] = {}
    for name, rule in rules.items():
        try:
            verdict(rule, unknowing)
        except UnknownValue as unknown:
            found[name] = unknown.path
    return found
