"""The policy pack (infra/policy_pack/) gives the offline gate's verdicts, rule by rule, on every committed stack.

No Pulumi CLI runs here, so the test is the CLI's side of the conversation: it starts the pack as the CLI does
(its own virtualenv, from the policy-pack lock; `python -u -m pulumi.policy ENGINE .` in the pack's folder, which
prints the port of its Analyzer service), then calls `GetAnalyzerInfo` and `AnalyzeStack` with each stack's
resources as the engine sends them (tests/infra/engine_view.py). The plan is the offline one (mock outputs); the
comparison is to the direct `verdict` of the same rules over it. A first preview's unknowns, the children of
remote components and a stack that requires the pack have tests of their own below; the mutation suites run
their mistakes through the pack's `validate` too (`policy_stack.validate_stack`, no gRPC).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from infra import deploy_route
from infra.config import load_stack_config
from infra.ops.stacks import ROOT, STACKS_DIR
from infra.rules.plan_view import Plan
from infra.rules.policy_stack import REMOTE_COMPONENTS, UNKNOWN, at_first_preview, preview_only, verdict
from infra.rules.registry import RULES
from tests.infra import engine_view

PACK = ROOT / "infra" / "policy_pack"
PACK_PYTHON = ROOT / ".venv-policy-pack" / "bin" / "python"
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in STACKS_DIR.glob("Pulumi.*.yaml"))


@pytest.fixture(scope="module")
def analyzer() -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    if not PACK_PYTHON.exists():
        pytest.fail(f"{PACK_PYTHON} is missing: run `make policy-pack` (make test does it first)")
    # As the CLI's pulumi-analyzer-policy-python does: `python -u -m pulumi.policy ENGINE .` in the pack's folder
    # (with the virtualenv PulumiPolicy.yaml names); the engine's address is only for logs, none here.
    pack = subprocess.Popen(
        [str(PACK_PYTHON), "-u", "-m", "pulumi.policy", "127.0.0.1:0", "."],
        cwd=PACK,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert pack.stdout is not None
        port = pack.stdout.readline().strip()
        if not port.isdigit():
            pytest.fail(f"the pack printed no port: {port!r} {pack.stderr.read() if pack.stderr else ''}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        pack.terminate()
        pack.wait(timeout=10)


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def _engine_resource(item: dict[str, Any], stack: str) -> analyzer_pb2.AnalyzerResource:
    owner = engine_view.provider(item, stack)
    return analyzer_pb2.AnalyzerResource(
        type=item["type"],
        properties=_struct(engine_view.properties(item)),
        urn=item["urn"],
        name=item["name"],
        provider=analyzer_pb2.AnalyzerProviderResource(urn=owner) if owner else None,
        parent=item["parent"] or "",
        dependencies=engine_view.dependencies(item),
        propertyDependencies={
            key: analyzer_pb2.AnalyzerPropertyDependencies(urns=urns)
            for key, urns in (item.get("property_dependencies") or {}).items()
        },
    )


def _diagnostics(analyzer: analyzer_pb2_grpc.AnalyzerStub, plan: Plan, stack: str) -> list[Any]:
    request = analyzer_pb2.AnalyzeStackRequest(resources=[_engine_resource(dict(item), stack) for item in plan])
    return list(analyzer.AnalyzeStack(request).diagnostics)


def _pack_verdicts(analyzer: analyzer_pb2_grpc.AnalyzerStub, plan: Plan, stack: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {name: [] for name in RULES}
    for diagnostic in _diagnostics(analyzer, plan, stack):
        # CrossGuard puts the policy's description before the reported message; the fix follows it.
        message = diagnostic.message.removeprefix(f"{diagnostic.description}\n")
        found.setdefault(diagnostic.policyName, []).append(message.rpartition(" (fix: ")[0] or message)
    return {name: sorted(messages) for name, messages in found.items()}


def _offline_verdicts(plan: Plan) -> dict[str, list[str]]:
    return {name: sorted(verdict(rule, plan) or []) for name, rule in RULES.items()}


def test_the_pack_runs_in_the_virtualenv_the_tests_use() -> None:
    runtime = yaml.safe_load((PACK / "PulumiPolicy.yaml").read_text())["runtime"]
    assert runtime["name"] == "python"
    assert (PACK / runtime["options"]["virtualenv"]).resolve() == PACK_PYTHON.parent.parent.resolve()


def test_the_pack_serves_every_rule(analyzer: analyzer_pb2_grpc.AnalyzerStub) -> None:
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "llm-batch"
    assert {policy.name for policy in info.policies} == set(RULES)
    levels = {policy.name: policy.enforcementLevel for policy in info.policies}
    assert levels == {
        name: analyzer_pb2.EnforcementLevel.Value(rule.enforcement.upper()) for name, rule in RULES.items()
    }


@pytest.mark.parametrize("stack", STACKS)
def test_the_pack_judges_a_stack_as_the_offline_gate(
    analyzer: analyzer_pb2_grpc.AnalyzerStub, plan_for: Callable[[str], Plan], stack: str
) -> None:
    plan = plan_for(stack)
    assert _pack_verdicts(analyzer, plan, stack) == _offline_verdicts(plan)


def test_the_pack_fails_what_the_gate_fails(
    analyzer: analyzer_pb2_grpc.AnalyzerStub, plan_for: Callable[[str], Plan]
) -> None:
    """A broken plan (IMDSv1 on the small node, its data bucket's public-access block loosened) fails the same
    rules with the same messages through the pack."""
    plan = copy.deepcopy(list(plan_for("small")))
    for item in plan:
        if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate":
            item["inputs"]["metadataOptions"]["httpTokens"] = "optional"
        if item["type"] == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
            item["inputs"]["blockPublicPolicy"] = False
    offline = _offline_verdicts(plan)
    assert offline["launch-templates"] and offline["buckets"]
    assert _pack_verdicts(analyzer, plan, "small") == offline


def _child(parent: Mapping[str, Any], type_token: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """A resource as a remote component's provider registers it under the component in a real run."""
    parent_type = parent["urn"].split("::")[2]
    return {
        "urn": f"{parent['urn'].rsplit('::', 2)[0]}::{parent_type}${type_token}::{name}",
        "type": type_token,
        "name": name,
        "parent": parent["urn"],
        "custom": True,
        "provider": None,
        "inputs": inputs,
        "outputs": {},
        "id": f"{name}-id",
        "dependencies": [parent["urn"]],
    }


def test_what_a_remote_component_builds_is_left_to_its_inputs(
    analyzer: analyzer_pb2_grpc.AnalyzerStub, plan_for: Callable[[str], Plan]
) -> None:
    """A real preview also holds what pulumi-eks and the helm chart register under their components, which the
    mocks never build: an `aws:eks/cluster:Cluster` named as the component's cluster, its role, a node group
    under a node group, a chart's Deployment; untagged and public, as no rule would pass them. The pack leaves
    them to the component's inputs, as the offline gate does, so the access entries still wait for "the"
    cluster and no rule sees a resource the gate never saw."""
    plan = list(plan_for("large"))
    children: list[dict[str, Any]] = []
    for item in plan:
        if item["type"] == "eks:index:Cluster":
            cluster = _child(
                item,
                "aws:eks/cluster:Cluster",
                f"{item['name']}-eksCluster",
                {
                    "name": item["inputs"]["name"],
                    "vpcConfig": {"endpointPublicAccess": True},
                    "tags": {},
                },
            )
            role = _child(cluster, "aws:iam/role:Role", f"{item['name']}-eksRole", {"tags": {}})
            children += [cluster, role]
        if item["type"] == "eks:index:ManagedNodeGroup":
            children.append(_child(item, "aws:eks/nodeGroup:NodeGroup", item["name"], {"tags": {}}))
        if item["type"] == "kubernetes:helm.sh/v4:Chart":
            children.append(_child(item, "kubernetes:apps/v1:Deployment", f"{item['name']}-deployment", {}))
    assert len(children) >= 4
    assert _pack_verdicts(analyzer, [*plan, *children], "large") == _offline_verdicts(plan)


def test_the_pack_knows_every_remote_component_of_the_program(plan_for: Callable[[str], Plan]) -> None:
    """The engine does not say which resources are components: the pack's list of remote ones (custom false,
    `remote`) must hold every remote type the program registers."""
    remote = {item["type"] for stack in STACKS for item in plan_for(stack) if item.get("remote")}
    assert remote <= REMOTE_COMPONENTS


def _not_judged(diagnostics: list[Any]) -> dict[str, str]:
    """{rule: message} of CrossGuard's "can't run policy ... during preview" diagnostics (advisory)."""
    advisory = analyzer_pb2.EnforcementLevel.Value("ADVISORY")
    found = {d.policyName: d.message for d in diagnostics if "during preview: " in d.message}
    assert all(d.enforcementLevel == advisory for d in diagnostics if d.policyName in found)
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_at_a_first_preview_the_pack_defers_the_rules_the_plan_names(
    analyzer: analyzer_pb2_grpc.AnalyzerStub, plan_for: Callable[[str], Plan], stack: str
) -> None:
    """The stack as a first `pulumi preview` sends it (ids, ARNs and inputs built from them as pulumi's unknown
    sentinels inside the Struct): the rules `preview_only` names (the plan command's line) are exactly those
    CrossGuard reports as not judged during preview, advisory; every other rule gives the offline verdict."""
    plan = plan_for(stack)
    deferred = preview_only(plan, RULES)
    assert deferred, "no rule reads a value unknown at preview: the test proves nothing"
    diagnostics = _diagnostics(analyzer, at_first_preview(plan), stack)
    assert set(_not_judged(diagnostics)) == set(deferred)
    judged: dict[str, list[str]] = {d.policyName: [] for d in diagnostics if d.policyName not in deferred}
    assert {name: v for name, v in _offline_verdicts(plan).items() if name not in deferred and v} == judged


def test_an_unknown_property_defers_its_rule_rather_than_pass_or_fail(
    analyzer: analyzer_pb2_grpc.AnalyzerStub, plan_for: Callable[[str], Plan]
) -> None:
    """One unknown in one resource's properties, as the CLI sends it at preview ("04da6b54-..." for a string):
    the rule that judges it is reported as not judged during preview (CrossGuard's documented behaviour), not
    passed on a value nobody knows, not failed on the sentinel as if it were one, and the pack does not crash."""
    plan = copy.deepcopy(list(plan_for("small")))
    template = next(item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate")
    template["inputs"]["metadataOptions"]["httpTokens"] = UNKNOWN
    diagnostics = _diagnostics(analyzer, plan, "small")
    not_judged = _not_judged(diagnostics)
    # secret-values reads every string of the plan, so it too waits for the value.
    assert set(not_judged) == {"launch-templates", "secret-values"}
    message = not_judged["launch-templates"]
    assert "::gpu-node-template.metadataOptions.httpTokens can't be known during preview" in message
    assert sorted(d.policyName for d in diagnostics) == ["launch-templates", "secret-values"]


# --- a stack that requires the pack -------------------------------------------------------------------------


def test_a_stack_that_requires_the_pack_names_how_to_attach_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program sees the pack only through PULUMI_OPTION_POLICY_PACK, which the CLI reads as --policy-pack."""
    required = load_stack_config("small", {"cost_center": "ml", "policy_pack_required": "true"})
    assert deploy_route.policy_pack_problem(load_stack_config("small", {"cost_center": "ml"}), {}) is None
    problem = deploy_route.policy_pack_problem(required, {})
    assert problem is not None and "\n" not in problem
    assert problem.startswith("llm-batch:policy_pack_required is true")
    assert "PULUMI_OPTION_POLICY_PACK=infra/policy_pack pulumi up" in problem
    monkeypatch.chdir(ROOT / "infra")  # where Pulumi runs the program
    for value, pwd in (
        ("infra/policy_pack", str(ROOT)),
        ("./infra/policy_pack/", "/elsewhere"),  # relative to the repository root
        (str(PACK), "/elsewhere"),
        ("policy_pack", str(ROOT / "infra")),
        ("/opt/org-pack,infra/policy_pack", str(ROOT)),
    ):
        assert deploy_route.policy_pack_problem(required, {"PULUMI_OPTION_POLICY_PACK": value, "PWD": pwd}) is None
    for value in ("", "/opt/org-pack", "infra", "tests/policy_pack"):
        assert deploy_route.policy_pack_problem(required, {"PULUMI_OPTION_POLICY_PACK": value, "PWD": "/x"})


_REAL_UP_WITHOUT_PACK = """
import json, os
from infra import deploy_route
from infra.ops import plan
from infra.ops.plan_mocks import PlanMocks

os.environ.pop("PULUMI_OPTION_POLICY_PACK", None)
deploy_route.under_offline_plan = lambda: False  # as under `pulumi up`: a real engine, not the mocks
created = []
mocks = PlanMocks(region="us-east-1")
new_resource = mocks.new_resource
mocks.new_resource = lambda args: (created.append(args.typ), new_resource(args))[1]
try:
    # A real address, so the e-mail guard (which runs first) lets the run reach this one.
    overrides = {"policy_pack_required": True, "alert_email": "ml-oncall@acme.com"}
    plan.run_program("small", overrides=overrides, mocks=mocks)
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error), "created": created}))
"""


def test_a_real_up_without_the_required_pack_stops_before_creating_anything() -> None:
    """The small stack with the key on, run as `pulumi up` would (dry_run off, not the offline plan), with no
    pack in its environment."""
    result = subprocess.run(
        [sys.executable, "-c", _REAL_UP_WITHOUT_PACK], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip(), result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["error"] == "RunError"
    assert outcome["message"].startswith("llm-batch:policy_pack_required is true")
    assert outcome["created"] == []
