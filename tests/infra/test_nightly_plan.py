"""Every stack's plan holds the nightly run: schedule, state machines, least-privilege roles, the sweep, and
(medium, large) the VPC submit function with its cluster access."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.config import decode_pulumi_values, load_stack_config
from infra.config.worker_groups import gpu_node_pool_names
from infra.ops.stacks import read_stack_config
from infra.rules import registry
from infra.statemachines import graph, placeholders
from tests.infra.conftest import STACKS
from tests.infra.test_nightly_definitions import invalid

Plan = list[dict[str, Any]]
NIGHTLY_TYPES = ("aws:sfn/stateMachine:StateMachine", "aws:scheduler/schedule:Schedule")


def _one(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    found = [item for item in plan if item["type"] == type_token and item["name"] == name]
    assert len(found) == 1, f"{type_token} {name}: {len(found)} in the plan"
    return found[0]


def _of(plan: Plan, type_token: str) -> list[dict[str, Any]]:
    return [item for item in plan if item["type"] == type_token]


def _config(stack: str) -> Any:
    values, _ = read_stack_config(stack)
    return load_stack_config(stack, decode_pulumi_values(values))


def _statements(plan: Plan, name: str) -> list[dict[str, Any]]:
    document = json.loads(_one(plan, "aws:iam/rolePolicy:RolePolicy", name)["inputs"]["policy"])
    statements: list[dict[str, Any]] = document["Statement"]
    return statements


def test_every_stack_is_planned() -> None:
    assert set(STACKS) >= {"small", "medium", "large"}


@pytest.mark.parametrize("stack", STACKS)
def test_the_schedule_starts_the_state_machine_on_the_stacks_cron(stack: str, plan_for: Callable[[str], Plan]) -> None:
    plan, config = plan_for(stack), _config(stack)
    machine = _one(plan, "aws:sfn/stateMachine:StateMachine", "nightly-run")
    schedule = _one(plan, "aws:scheduler/schedule:Schedule", "nightly-schedule")["inputs"]
    assert schedule["scheduleExpression"] == config.schedule.cron
    assert schedule["scheduleExpressionTimezone"] == config.schedule.timezone
    assert schedule["state"] == ("ENABLED" if config.schedule.enabled else "DISABLED")
    assert schedule["target"]["arn"] == machine["outputs"]["arn"]
    assert json.loads(schedule["target"]["input"]) == {"scheduled_time": "<aws.scheduler.scheduled-time>"}
    sweep = _one(plan, "aws:sfn/stateMachine:StateMachine", "nightly-sweep")
    sweep_schedule = _one(plan, "aws:scheduler/schedule:Schedule", "nightly-sweep-schedule")["inputs"]
    assert sweep_schedule["target"]["arn"] == sweep["outputs"]["arn"]
    assert sweep_schedule["state"] == "ENABLED", "the sweep guards the GPUs even when the nightly run is off"


@pytest.mark.parametrize("stack", STACKS)
def test_the_planned_definitions_are_valid_and_always_release(
    stack: str, plan_for: Callable[[str], Plan], tmp_path: Path
) -> None:
    plan, config = plan_for(stack), _config(stack)
    definitions = {
        name: json.loads(_one(plan, "aws:sfn/stateMachine:StateMachine", name)["inputs"]["definition"])
        for name in ("nightly-run", "nightly-sweep")
    }
    assert invalid(definitions, tmp_path) == {}
    for name, definition in definitions.items():
        assert not placeholders(definition), f"{name}: placeholders left unfilled"
        assert all(graph.catches_everything(s) for s in graph.states(definition).values() if s["Type"] == "Task")
    run = json.loads(_one(plan, "aws:sfn/stateMachine:StateMachine", "nightly-run")["inputs"]["definition"])
    releases = graph.matching(run, graph.is_release)
    for start in graph.matching(run, graph.is_capacity_start):
        reachable = graph.reachable(run, start, blocked=releases)
        assert not {n for n in reachable if graph.is_terminal(graph.states(run)[n])}
    # Only a night skipped for want of input ends without a release, and it never asked for capacity.
    before = graph.reachable(run, run["StartAt"], blocked=releases | graph.matching(run, graph.is_capacity_start))
    assert {n for n in before if graph.is_terminal(graph.states(run)[n])} == {"RunSkipped"}
    deadline_s = config.schedule.run_deadline_minutes * 60
    assert run["TimeoutSeconds"] > deadline_s
    wait = graph.states(run)["WaitForJob"]["Seconds"]
    max_polls = graph.states(run)["DeadlinePassed"]["Choices"][0]["NumericGreaterThanEquals"]
    assert max_polls * wait >= deadline_s
    # Within a standard execution's 25,000-event history: bound one poll by every state of the polling loop
    # (its strongly connected part, retry path included), 5 events per task and 2 per other state.
    loop = {s for s in graph.reachable(run, "WaitForJob") if "WaitForJob" in graph.reachable(run, s)}
    per_poll = sum(5 if graph.states(run)[s]["Type"] == "Task" else 2 for s in loop)
    assert max_polls * per_poll < 25_000, f"{max_polls} polls x {per_poll} events"
    plan_run = graph.states(run)["PlanRun"]["Parameters"]
    bucket = _of(plan, "aws:s3/bucket:Bucket")[0]["outputs"]["bucket"]
    expected = "s3://" + bucket + "/" + config.job.output_prefix.replace("{date}", "{}")
    assert plan_run["output_uri.$"] == f"States.Format('{expected}', $.date)"


@pytest.mark.parametrize("stack", STACKS)
def test_the_roles_are_least_privilege(stack: str, plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for(stack)
    roles = {item["name"]: item for item in _of(plan, "aws:iam/role:Role") if item["name"].startswith("nightly-")}
    services = {
        "nightly-run-role": "states.amazonaws.com",
        "nightly-sweep-role": "states.amazonaws.com",
        "nightly-scheduler-role": "scheduler.amazonaws.com",
    }
    if stack != "small":
        services["nightly-submit-role"] = "lambda.amazonaws.com"
    assert set(roles) == set(services)
    for name, service in services.items():
        (statement,) = json.loads(roles[name]["inputs"]["assumeRolePolicy"])["Statement"]
        assert statement["Principal"] == {"Service": service}
        assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}
    for name in ("nightly-run-policy", "nightly-sweep-policy", "nightly-scheduler-policy"):
        for statement in _statements(plan, name):
            assert "*" not in json.dumps(statement.get("Resource")).replace("/*", "").replace(":*", ""), (
                f"{name} {statement['Sid']}: a wildcard resource"
            )
    # The policy checks every plan must pass, on this component's resources.
    nightly = [item for item in plan if item["name"].startswith("nightly-")]
    assert registry.check_iam(nightly) == []
    untagged = [v for v in registry.check_cost_tags(plan) if v.resource.split()[-1].startswith("nightly-")]
    assert untagged == []


def test_small_drives_its_own_auto_scaling_group(plan_for: Callable[[str], Plan]) -> None:
    plan = plan_for("small")
    (group,) = _of(plan, "aws:autoscaling/group:Group")
    run = json.loads(_one(plan, "aws:sfn/stateMachine:StateMachine", "nightly-run")["inputs"]["definition"])
    capacity = [graph.states(run)[name] for name in graph.matching(run, graph.is_release)]
    assert {state["Parameters"]["AutoScalingGroupName"] for state in capacity} == {group["inputs"]["name"]}
    (scale,) = [s for s in _statements(plan, "nightly-run-policy") if s["Sid"] == "ScaleGpuGroup"]
    assert scale["Action"] == "autoscaling:SetDesiredCapacity"
    assert scale["Resource"].endswith(f":autoScalingGroupName/{group['inputs']['name']}")
    assert not _of(plan, "aws:lambda/function:Function") or all(
        not item["name"].startswith("nightly-") for item in _of(plan, "aws:lambda/function:Function")
    )


@pytest.mark.parametrize("stack", [stack for stack in STACKS if stack != "small"])
def test_eks_tiers_submit_through_a_function_inside_the_vpc(stack: str, plan_for: Callable[[str], Plan]) -> None:
    plan, config = plan_for(stack), _config(stack)
    function = _one(plan, "aws:lambda/function:Function", "nightly-submit")
    inputs = function["inputs"]
    (submitter_sg,) = [
        item for item in _of(plan, "aws:ec2/securityGroup:SecurityGroup") if item["name"].endswith("-submitter")
    ]
    assert inputs["vpcConfig"]["securityGroupIds"] == [submitter_sg["id"]]
    private = {item["id"] for item in _of(plan, "aws:ec2/subnet:Subnet") if "private" in item["name"]}
    assert set(inputs["vpcConfig"]["subnetIds"]) <= private and inputs["vpcConfig"]["subnetIds"]
    environment = inputs["environment"]["variables"]
    assert environment["API_SERVER"].startswith("https://")
    assert environment["NAMESPACE"] == config.eks.namespace
    if config.eks.karpenter_enabled:
        assert environment["CAPACITY_MODE"] == "karpenter"
        # Every GPU NodePool of the night (both worker groups, Spot and fallback): the release empties them all.
        assert environment["KARPENTER_NODEPOOL"] == ",".join(gpu_node_pool_names(config.eks))
        assert environment["KARPENTER_NODEPOOL"].split(",")[0] == config.eks.node_pool.name
        _one(plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "nightly-submit-nodeclaims")
    else:
        assert environment["CAPACITY_MODE"] == "nodegroup"
        assert environment["GPU_NODES"] == str(config.eks.gpu_max_nodes)
    run = json.loads(_one(plan, "aws:sfn/stateMachine:StateMachine", "nightly-run")["inputs"]["definition"])
    invoked = {
        s["Parameters"]["FunctionName"]
        for s in graph.states(run).values()
        if s["Type"] == "Task" and s["Resource"].endswith(":lambda:invoke")
    }
    assert invoked == {function["outputs"]["arn"]}
    (invoke,) = [s for s in _statements(plan, "nightly-run-policy") if s["Sid"] == "DriveRayJob"]
    assert invoke["Resource"] == function["outputs"]["arn"]
    entry = _one(plan, "aws:eks/accessEntry:AccessEntry", "nightly-submit-access")["inputs"]
    assert entry["kubernetesGroups"] == ["llm-batch-nightly"]
    role = _one(plan, "kubernetes:rbac.authorization.k8s.io/v1:Role", "nightly-submit-rbac")["inputs"]
    assert role["metadata"]["namespace"] == config.eks.namespace
    rules = {(rule["apiGroups"][0], rule["resources"][0]): set(rule["verbs"]) for rule in role["rules"]}
    assert rules == {
        ("ray.io", "rayjobs"): {"create", "get", "list", "delete"},
        ("", "configmaps"): {"create", "list", "delete"},
    }


@pytest.mark.parametrize("stack", [stack for stack in STACKS if stack != "small"])
def test_the_submit_function_logs_encrypted_where_the_stack_key_allows(
    stack: str, plan_for: Callable[[str], Plan]
) -> None:
    plan = plan_for(stack)
    logs = _one(plan, "aws:cloudwatch/logGroup:LogGroup", "nightly-submit-logs")["inputs"]
    function = _one(plan, "aws:lambda/function:Function", "nightly-submit")["inputs"]
    assert logs["name"] == f"/llm-batch/{stack}/submit-rayjob" and logs["kmsKeyId"]
    assert function["loggingConfig"]["logGroup"] == logs["name"]


def test_nightly_args_need_exactly_one_kind_of_capacity() -> None:
    from infra.aws_context import AwsContext
    from infra.components.nightly import NightlyArgs

    context = AwsContext(account_id="123456789012", partition="aws", region="us-east-1", dns_suffix="amazonaws.com")
    common: dict[str, Any] = {
        "stack": "small",
        "context": context,
        "cron": "cron(0 1 * * ? *)",
        "timezone": "UTC",
        "enabled": True,
        "run_deadline_minutes": 60,
        "input_prefix": "input/{date}/",
        "output_prefix": "output/{date}/",
        "bucket_name": "b",
        "key_arn": "k",
        "alerts_topic_arn": "t",
    }
    with pytest.raises(ValueError, match="exactly one of group_name"):
        NightlyArgs(**common)
