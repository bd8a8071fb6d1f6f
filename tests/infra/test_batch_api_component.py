"""The Batch API's front in the plan (infra/components/batch_api.py), its policy rules and its build.

The plans are the Pulumi program under the plan's mocks (`capture_plan`, as `make plan` runs it): the small tier
with `batch_api.enabled` (its front drives the GPU group) and the large one (EKS: no group), `front_plans` in
conftest.py, beside the session's
default plans, where the flag is off. The bundle's wheels are downloaded by `python tools/lambda_bundle.py`
(network); here the lock and the command are checked without it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra import naming
from infra.components import batch_api
from infra.rules import checks_batch_api, registry
from tests.infra.plan_select import children, component, stack_key
from tests.infra.test_added_resource_mutations import add
from workload.contract import metric_names as mn

Plan = list[dict[str, Any]]
ROOT = Path(__file__).resolve().parents[2]


def _named(plan: Plan, type_token: str, name: str) -> dict[str, Any]:
    (found,) = [item for item in plan if item["type"] == type_token and item["name"] == name]
    return found


def _statements(plan: Plan, policy: str = "batch-api-policy") -> list[dict[str, Any]]:
    """A role's inline statements: the tick's (`batch-api-policy`) or the HTTP function's (`batch-api-front-policy`)."""
    return list(json.loads(_named(plan, "aws:iam/rolePolicy:RolePolicy", policy)["inputs"]["policy"])["Statement"])


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_without_the_flag_there_is_no_front(plan_for: Callable[[str], Plan]) -> None:
    for tier in ("small", "medium", "large"):
        plan = plan_for(tier)
        assert not [item["name"] for item in plan if item["name"].startswith("batch-api")], tier
        stack = next(item for item in plan if item["type"] == "pulumi:pulumi:Stack")
        assert not {"batch_api_url", "batch_api_tick_function_name"} & set(stack["outputs"]), tier


@pytest.mark.parametrize("tier", ["small", "large"])
def test_the_front_routes_every_request_to_its_function_and_passes_the_gate(
    front_plans: dict[str, Plan], tier: str
) -> None:
    plan = front_plans[tier]
    api = _named(plan, "aws:apigatewayv2/api:Api", "batch-api-http")["inputs"]
    assert api["protocolType"] == "HTTP" and api["tags"] == {batch_api.PUBLIC_ENDPOINT_TAG: "acknowledged"}
    (route,) = [item for item in plan if item["type"] == "aws:apigatewayv2/route:Route"]
    integration = _named(plan, "aws:apigatewayv2/integration:Integration", "batch-api-function")
    assert route["inputs"] == {**route["inputs"], "routeKey": "$default", "target": f"integrations/{integration['id']}"}
    http = _named(plan, "aws:lambda/function:Function", "batch-api-http")
    assert integration["inputs"]["integrationType"] == "AWS_PROXY"
    assert integration["inputs"]["payloadFormatVersion"] == "2.0"
    assert integration["inputs"]["integrationUri"] == http["outputs"]["arn"]
    for function, handler in (("batch-api-http", batch_api.HTTP_HANDLER), ("batch-api-tick", batch_api.TICK_HANDLER)):
        inputs = _named(plan, "aws:lambda/function:Function", function)["inputs"]
        assert (inputs["runtime"], inputs["architectures"], inputs["handler"]) == ("python3.12", ["arm64"], handler)
        assert inputs["kmsKeyArn"] == stack_key(plan)["outputs"]["arn"]
    schedule = _named(plan, "aws:scheduler/schedule:Schedule", "batch-api-tick-schedule")["inputs"]
    assert schedule["scheduleExpression"] == "rate(5 minutes)"
    assert schedule["target"]["arn"] == _named(plan, "aws:lambda/function:Function", "batch-api-tick")["outputs"]["arn"]
    for name in ("batch-api-logs", "batch-api-access-logs"):
        group = _named(plan, "aws:cloudwatch/logGroup:LogGroup", name)["inputs"]
        assert group["kmsKeyId"] == stack_key(plan)["outputs"]["arn"] and group["retentionInDays"] > 0
    registry.gate(plan)  # every rule of the tier: IAM allowlist, store keys, the two API rules


@pytest.mark.parametrize("tier", ["small", "large"])
def test_the_ticks_role_reaches_only_its_prefix_key_and_machine_and_no_api_key(
    front_plans: dict[str, Plan], tier: str
) -> None:
    plan = front_plans[tier]
    stack = next(item for item in plan if item["type"] == "pulumi:pulumi:Stack")["outputs"]
    bucket = f"arn:aws:s3:::{stack['data_bucket']}"
    machine = stack["nightly_state_machine_arn"]
    by_sid = {statement["Sid"]: statement for statement in _statements(plan)}
    assert all(statement["Resource"] != "*" for statement in by_sid.values())
    assert by_sid["ApiObjects"]["Resource"] == f"{bucket}/batch-api/*"
    assert by_sid["ListApiPrefix"]["Condition"] == {"StringLike": {"s3:prefix": ["batch-api/*"]}}
    # No API key (issue 60); of Secrets Manager only the keys' webhooks, which it alone sends (issue 63).
    webhooks = _named(plan, "aws:secretsmanager/secret:Secret", "batch-api-webhooks")
    assert webhooks["inputs"]["name"] == f"llm-batch-{tier}/batch-api-webhooks"
    assert webhooks["inputs"]["kmsKeyId"] == stack["kms_key_arn"]
    reads = [s for s in by_sid.values() if "secretsmanager:" in json.dumps(s)]
    assert "ReadApiKeys" not in by_sid and reads == [by_sid["ReadWebhooks"]]
    assert by_sid["ReadWebhooks"]["Resource"] == webhooks["outputs"]["arn"]
    # Its events go to the stack's default bus and no other (workload/batch_api/events.py).
    assert by_sid["SendBatchEvents"]["Action"] == "events:PutEvents"
    region, account = machine.split(":")[3:5]  # the stack's own: no other account's or region's bus
    assert by_sid["SendBatchEvents"]["Resource"] == f"arn:aws:events:{region}:{account}:event-bus/default"
    assert by_sid["UseStackKey"]["Resource"] == stack["kms_key_arn"]
    assert by_sid["RunBatches"]["Resource"] == machine
    assert by_sid["FollowBatches"]["Resource"] == machine.replace(":stateMachine:", ":execution:") + ":*"
    assert ("ReleaseGpuGroup" in by_sid) == (tier == "small")
    # EKS: a stop invokes the nightly submit function's release (issue 59, finding 6); that function and no other.
    assert ("ReleaseRayJob" in by_sid) == (tier != "small")
    if tier != "small":
        submit = _named(plan, "aws:lambda/function:Function", "nightly-submit")["outputs"]["arn"]
        assert by_sid["ReleaseRayJob"]["Action"] == "lambda:InvokeFunction"
        assert by_sid["ReleaseRayJob"]["Resource"] == submit
    actions = [action for statement in by_sid.values() for action in _as_list(statement["Action"])]
    assert not [action for action in actions if action.endswith("*")]


@pytest.mark.parametrize("tier", ["small", "large"])
def test_the_internet_facing_function_has_its_own_role_its_own_keys_and_cannot_run_executions(
    front_plans: dict[str, Plan], tier: str
) -> None:
    """Issue 60, findings 2 and 6; fails on main, where the HTTP function ran as the tick's role (StartExecution,
    StopExecution) and read the online endpoint's keys."""
    plan = front_plans[tier]
    stack = next(item for item in plan if item["type"] == "pulumi:pulumi:Stack")["outputs"]
    keys = _named(plan, "aws:secretsmanager/secret:Secret", "batch-api-keys")
    assert keys["inputs"]["name"] == f"llm-batch-{tier}/batch-api-keys"
    assert keys["inputs"]["kmsKeyId"] == stack["kms_key_arn"]
    assert not [item for item in plan if "SecretVersion" in item["type"] and "batch-api" in item["name"]]
    functions = {item["name"]: item for item in plan if item["type"] == "aws:lambda/function:Function"}
    http, tick = functions["batch-api-http"], functions["batch-api-tick"]
    roles = {item["outputs"]["arn"]: item["name"] for item in plan if item["type"] == "aws:iam/role:Role"}
    assert (roles[http["inputs"]["role"]], roles[tick["inputs"]["role"]]) == ("batch-api-front-role", "batch-api-role")
    variables = http["inputs"]["environment"]["variables"]
    assert variables["LLM_BATCH_API_KEY_SECRET"] == keys["outputs"]["arn"] and variables["LLM_BATCH_API_SCOPE"] == "key"
    assert variables["LLM_BATCH_TICK_FUNCTION"] == tick["inputs"]["name"]
    # GET /v1/models (issue 57): the job's model first, then its aliases and adapters.
    assert variables["LLM_BATCH_SERVED_MODELS"].split(",")[0] == variables["LLM_BATCH_MODEL"]
    assert "LLM_BATCH_API_KEY_SECRET" not in tick["inputs"]["environment"]["variables"]
    # Both record the batches' events; the front's role may neither put them nor read the webhooks (issue 63).
    webhooks = _named(plan, "aws:secretsmanager/secret:Secret", "batch-api-webhooks")["outputs"]["arn"]
    for function in (http, tick):
        events_env = function["inputs"]["environment"]["variables"]
        assert events_env["LLM_BATCH_WEBHOOKS_SECRET"] == webhooks
        assert events_env["LLM_BATCH_EVENT_BUS"].endswith(":event-bus/default")
    by_sid = {statement["Sid"]: statement for statement in _statements(plan, "batch-api-front-policy")}
    assert not [s for s in by_sid.values() if "events:" in json.dumps(s) or webhooks in json.dumps(s)]
    assert by_sid["ReadApiKeys"] == {**by_sid["ReadApiKeys"], "Resource": keys["outputs"]["arn"]}
    assert by_sid["AskTheTick"]["Action"] == "lambda:InvokeFunction"
    assert by_sid["AskTheTick"]["Resource"] == tick["outputs"]["arn"]
    actions = [action for statement in by_sid.values() for action in _as_list(statement["Action"])]
    assert not [action for action in actions if action.startswith(("states:", "autoscaling:"))]
    assert not [action for action in actions if action.endswith("*")]
    assert all(statement["Resource"] != "*" for statement in by_sid.values())


def open_route(plan: Plan) -> None:
    """A newcomer's second route: `ANY /admin` straight to an HTTP backend, past the function's key check."""
    api = _named(plan, "aws:apigatewayv2/api:Api", "batch-api-http")
    proxy = add(plan, "aws:apigatewayv2/integration:Integration", "admin-proxy",
                {"apiId": api["id"], "integrationType": "HTTP_PROXY", "integrationUri": "https://10.0.0.5/admin",
                 "integrationMethod": "ANY"})  # fmt: skip
    add(plan, "aws:apigatewayv2/route:Route", "admin-route",
        {"apiId": api["id"], "routeKey": "ANY /admin", "target": f"integrations/{proxy['id']}"})  # fmt: skip


def route_to_another_function(plan: Plan) -> None:
    """The `$default` route pointed at another function (the tick), which checks no key."""
    tick = _named(plan, "aws:lambda/function:Function", "batch-api-tick")
    integration = _named(plan, "aws:apigatewayv2/integration:Integration", "batch-api-function")
    integration["inputs"]["integrationUri"] = tick["outputs"]["arn"]


def unacknowledged_endpoint(plan: Plan) -> None:
    """A stack that enables the front without saying it may be on the internet (the program then sets no tag)."""
    _named(plan, "aws:apigatewayv2/api:Api", "batch-api-http")["inputs"]["tags"] = {}


def added_function_url(plan: Plan) -> None:
    add(plan, "aws:lambda/functionUrl:FunctionUrl", "quick-url", {"functionName": "x", "authorizationType": "NONE"})


MUTATIONS = [
    (open_route, "api-routes", "admin-route"),
    (route_to_another_function, "api-routes", "batch-api-default-route"),
    (added_function_url, "api-routes", "quick-url"),
    (unacknowledged_endpoint, "public-endpoints", "batch-api-http"),
    (added_function_url, "public-endpoints", "quick-url"),
]


@pytest.mark.parametrize(("mistake", "rule", "resource"), MUTATIONS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_an_open_route_or_an_unacknowledged_endpoint_is_refused(
    front_plans: dict[str, Plan], mistake: Callable[[Plan], None], rule: str, resource: str
) -> None:
    plan = copy.deepcopy(front_plans["small"])
    assert registry.RULES[rule].check(plan) == []
    mistake(plan)
    violations = registry.RULES[rule].check(plan)
    assert any(resource in violation.resource for violation in violations), violations
    with pytest.raises(registry.PolicyError, match=f"(?s){rule}.*fix: "):
        registry.gate(plan)


def test_an_exported_url_without_an_api_is_refused(front_plans: dict[str, Plan]) -> None:
    plan = [item for item in copy.deepcopy(front_plans["small"]) if item["type"] != "aws:apigatewayv2/api:Api"]
    for check in (checks_batch_api.check_api_routes, checks_batch_api.check_public_endpoints):
        assert any("exports batch_api_url" in violation.problem for violation in check(plan))


def test_the_lock_pins_the_functions_set_with_hashes_for_its_platform() -> None:
    from tools import lambda_bundle

    wanted = {line.split("==")[0].lower(): line.split("==")[1].strip()
              for line in (ROOT / "requirements" / "lambda.txt").read_text().splitlines() if "==" in line}  # fmt: skip
    entries = [block for block in (ROOT / "requirements" / "lambda.lock").read_text().split("\n") if "==" in block]
    locked = {line.split("==")[0]: line.split("==")[1].split()[0] for line in entries}
    assert {name: locked.get(name) for name in wanted} == wanted  # the lock is the pins' closure, same versions
    text = (ROOT / "requirements" / "lambda.lock").read_text()
    assert text.count("--hash=sha256:") == len(entries)
    command = lambda_bundle.download_command(Path("requirements/lambda.lock"), Path("/tmp/x"))
    # Every manylinux tag Lambda's glibc takes up to the lock's 2.28 (Pillow 13 ships manylinux_2_28 arm64 wheels
    # only), down to manylinux2014, where the other wheels are.
    platforms = [command[i + 1] for i, arg in enumerate(command) if arg == "--platform"]
    assert platforms[0] == "manylinux_2_28_aarch64" and platforms[-1] == "manylinux2014_aarch64"
    assert "manylinux_2_17_aarch64" in platforms and all(p.endswith("_aarch64") for p in platforms)
    assert command[command.index("--python-version") + 1] == "3.12"
    assert {"--no-deps", "--require-hashes", ":all:"} <= set(command)


def test_an_up_without_the_built_bundle_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(batch_api, "BUNDLE_DIR", tmp_path / "build" / "batch-api-lambda")
    monkeypatch.setattr(batch_api, "ROOT", tmp_path)
    with pytest.raises(ValueError, match=r"build/batch-api-lambda is not built: run `python tools/lambda_bundle.py`"):
        batch_api.bundle_archive(plan_only=False)
    batch_api.BUNDLE_DIR.mkdir(parents=True)
    (batch_api.BUNDLE_DIR / ".lock-sha256").write_text("another lock")
    with pytest.raises(ValueError, match=r"was built from another requirements/lambda\.lock"):
        batch_api.bundle_archive(plan_only=False)
    (batch_api.BUNDLE_DIR / ".lock-sha256").write_text(batch_api.bundle_stamp())
    assert batch_api.bundle_archive(plan_only=False).path == str(batch_api.BUNDLE_DIR)


def _policy(plan: Plan, type_token: str, name: str) -> str:
    return str(_named(plan, type_token, name)["inputs"]["policy"])


def test_a_batchs_run_may_read_its_file_and_write_its_output_only_when_the_front_is_on(
    plan_for: Callable[[str], Plan], front_plans: dict[str, Plan]
) -> None:
    """The job's and the nightly machine's roles gain the batch prefixes (not the records); the prefixes are the
    store's layout (workload/batch_api/service.py: files/<id>.jsonl, batches/<id>/output/)."""
    import fnmatch

    run, job = ("aws:iam/rolePolicy:RolePolicy", "nightly-run-policy"), ("aws:iam/policy:Policy", "job-access-policy")
    for token, name in (run, job):
        assert "batch-api/" not in _policy(plan_for("small"), token, name)
        on = _policy(front_plans["small"], token, name)
        assert batch_api.BATCH_INPUT_PREFIX in on and batch_api.BATCH_OUTPUT_PREFIX in on
        assert "batch-api/records" not in on and "batch-api/*" not in on
    assert fnmatch.fnmatch("batch-api/files/file-1a2b.jsonl", f"{batch_api.BATCH_INPUT_PREFIX}*")
    assert fnmatch.fnmatch("batch-api/batches/batch_1/output/summary.json", f"{batch_api.BATCH_OUTPUT_PREFIX}*")
    assert not fnmatch.fnmatch("batch-api/batches/batch_1/execution.json", f"{batch_api.BATCH_OUTPUT_PREFIX}*")


@pytest.mark.parametrize("tier", ["small", "large"])
def test_with_the_front_the_machine_drains_the_queue_and_the_night_is_queued(
    front_plans: dict[str, Plan], plan_for: Callable[[str], Plan], tier: str
) -> None:
    """The planned machine has NextBatch on the tick function (named before it exists, so no cycle between the
    two), the run role may invoke it, the night's schedule queues the night through it; without the front the
    machine and the schedule are as they were."""
    from infra.statemachines import timing

    plan = front_plans[tier]
    tick = _named(plan, "aws:lambda/function:Function", "batch-api-tick")["outputs"]
    machine = _named(plan, "aws:sfn/stateMachine:StateMachine", "nightly-run")["inputs"]
    states = json.loads(machine["definition"])["States"]
    assert states["NextBatch"]["Parameters"]["FunctionName"].endswith(f":function:{tick['name']}")
    tick_arn = states["NextBatch"]["Parameters"]["FunctionName"]
    asked = states["NextBatch"]["Parameters"]["Payload"]["next_batch"]
    assert asked["poll_budget"] == timing.QUEUE_POLL_BUDGET
    run_role = json.loads(_policy(plan, "aws:iam/rolePolicy:RolePolicy", "nightly-run-policy"))["Statement"]
    assert {
        "Sid": "TakeNextRun",
        "Effect": "Allow",
        "Action": "lambda:InvokeFunction",
        "Resource": tick_arn,
    } in run_role
    night = _named(plan, "aws:scheduler/schedule:Schedule", "nightly-schedule")["inputs"]["target"]
    assert night["arn"] == tick_arn
    assert json.loads(night["input"]) == {"enqueue_night": "<aws.scheduler.scheduled-time>"}
    scheduler = json.loads(_policy(plan, "aws:iam/rolePolicy:RolePolicy", "nightly-scheduler-policy"))["Statement"]
    assert {s["Sid"]: s["Resource"] for s in scheduler}["QueueTheNight"] == tick_arn
    off = json.loads(_named(plan_for(tier), "aws:sfn/stateMachine:StateMachine", "nightly-run")["inputs"]["definition"])
    assert "NextBatch" not in off["States"]
    if tier == "small":  # the node holds on for the queue's next run request; without the front it does not
        import base64

        def script(of: Plan) -> str:
            (template,) = [item for item in of if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
            return base64.b64decode(template["inputs"]["userData"]).decode()

        from infra.config import load_stack_config

        hold = timing.next_run_hold_s(load_stack_config("small", {"cost_center": "cc"}).schedule.run_deadline_minutes)
        assert f"local hold={hold} " in script(plan)
        assert "local hold=0 " in script(plan_for(tier))


@pytest.mark.parametrize("tier", ["small", "large"])
def test_one_tick_at_a_time_and_a_throttled_next_batch_waits_out_the_running_tick(
    front_plans: dict[str, Plan], tier: str
) -> None:
    """The tick runs at most `batch_api.tick_reserved_concurrency` (default 1) at once, so overlapping ticks (the
    schedule's, the nightly enqueue, the machine's NextBatch) take turns (issue 59, finding 5); the HTTP function
    reserves its own `batch_api.http_reserved_concurrency` (default 20, issue 60, finding 4). The machine's NextBatch
    retries a throttle for longer than the tick ahead of it can run plus one more queued tick, so a busy tick never
    ends a drain that had a queued run to take."""
    plan = front_plans[tier]
    tick = _named(plan, "aws:lambda/function:Function", "batch-api-tick")["inputs"]
    http = _named(plan, "aws:lambda/function:Function", "batch-api-http")["inputs"]
    assert tick["reservedConcurrentExecutions"] == 1
    assert http["reservedConcurrentExecutions"] == 20
    states = json.loads(_named(plan, "aws:sfn/stateMachine:StateMachine", "nightly-run")["inputs"]["definition"])[
        "States"
    ]
    for name in ("NextBatch", "NextBatchAfterSkip"):
        (throttle,) = [r for r in states[name]["Retry"] if "Lambda.TooManyRequestsException" in r["ErrorEquals"]]
        waits = [throttle["IntervalSeconds"] * throttle["BackoffRate"] ** n for n in range(throttle["MaxAttempts"])]
        assert sum(waits) >= 2 * batch_api.TICK_TIMEOUT_S, (name, sum(waits))
        assert throttle["ErrorEquals"] == ["Lambda.TooManyRequestsException"], name


@pytest.mark.parametrize("tier", ["small", "large"])
def test_a_stopped_runs_partial_files_are_waited_for_as_long_as_the_tier_takes_to_stop_its_job(
    front_plans: dict[str, Plan], tier: str
) -> None:
    """LLM_BATCH_STOP_WAIT_S on both functions (issue 59, finding 6). The small tier's executor sets the GPU group to 0
    itself, so the job's stop is `docker stop`'s wait. On EKS a stopped execution leaves its RayJob running until the
    GPU sweep deletes it (its schedule is planned here too), and the job then has its pods' termination grace: the
    bound covers both, so a cancelled batch is not closed before its job was even asked to stop."""
    from infra.components import nightly
    from infra.config import load_stack_config
    from infra.k8s.rayjob import termination_grace_s
    from infra.statemachines import timing
    from workload.contract.entrypoint import stop_timeout_s

    plan = front_plans[tier]
    grace = load_stack_config(tier, {"cost_center": "cc"}).job_config("s3://b/i/", "s3://b/o/").resume.grace_period_s
    functions = [_named(plan, "aws:lambda/function:Function", f"batch-api-{f}")["inputs"] for f in ("http", "tick")]
    waits = {int(f["environment"]["variables"]["LLM_BATCH_STOP_WAIT_S"]) for f in functions}
    releases = {f["environment"]["variables"]["LLM_BATCH_RELEASE_FUNCTION"] for f in functions}
    if tier == "small":
        assert waits == {stop_timeout_s(grace)} and releases == {""}  # the small tier's front sets its group to 0
        return
    # The front deletes the stopped run's RayJob through the submit function at once; the bound still covers the
    # sweep, should that invocation fail.
    assert releases == {_named(plan, "aws:lambda/function:Function", "nightly-submit")["outputs"]["arn"]}
    (wait,) = waits
    sweep = _named(plan, "aws:scheduler/schedule:Schedule", "nightly-sweep-schedule")["inputs"]
    assert sweep["scheduleExpression"] == nightly.SWEEP_EVERY == f"rate({timing.SWEEP_MINUTES} minutes)"
    assert wait >= timing.SWEEP_MINUTES * 60 + termination_grace_s(grace) > grace


def test_the_ticks_reserved_concurrency_is_the_stack_configs() -> None:
    """`batch_api.tick_reserved_concurrency` reaches the tick's arguments (from_config), as the other settings do."""
    from infra.config import load_stack_config

    config = load_stack_config("small", {"cost_center": "cc", "batch_api": {"tick_reserved_concurrency": 3}})
    assert config.batch_api.tick_reserved_concurrency == 3
    unused: Any = None  # the account context and the code archive: from_config only carries them
    args = batch_api.BatchApiArgs.from_config(
        "small", config, unused, "bucket", "key", "arn:aws:states:us-east-1:1:stateMachine:x", unused
    )
    assert args.tick_reserved_concurrency == 3


def test_the_quotas_and_the_http_functions_reservation_are_the_stack_configs(front_plans: dict[str, Plan]) -> None:
    """`batch_api.quotas` reaches both functions as LLM_BATCH_QUOTA_* (the front reads them back into the same
    model), and `batch_api.http_reserved_concurrency` the HTTP function's arguments (issue 60, finding 4)."""
    from infra.config import load_stack_config
    from workload.batch_api.lambda_front import pool_settings_from_env
    from workload.contract.batch_api_quotas import BatchApiQuotas

    overrides = {"http_reserved_concurrency": 7, "quotas": {"open_batches": 3, "max_n": 2}}
    config = load_stack_config("small", {"cost_center": "cc", "batch_api": overrides})
    unused: Any = None  # the account context and the code archive: from_config only carries them
    args = batch_api.BatchApiArgs.from_config(
        "small", config, unused, "bucket", "key", "arn:aws:states:us-east-1:1:stateMachine:x", unused
    )
    assert args.http_reserved_concurrency == 7
    assert args.pool_batches == 4  # the stack's default: batches of one endpoint share a run (pools.py)
    assert BatchApiQuotas.from_env(args.quotas.env()) == BatchApiQuotas(open_batches=3, max_n=2)
    for function in ("batch-api-http", "batch-api-tick"):
        variables = _named(front_plans["small"], "aws:lambda/function:Function", function)["inputs"]["environment"]
        assert BatchApiQuotas.from_env(variables["variables"]) == BatchApiQuotas(), function
        assert {name for name in variables["variables"] if name.startswith("LLM_BATCH_QUOTA_")} == set(
            BatchApiQuotas().env()
        )
        # The front reads the pool's size back as the scheduler's (workload/batch_api/lambda_front.py).
        assert pool_settings_from_env(variables["variables"]).max_batches == 4, function


@pytest.mark.parametrize("tier", ["small", "large"])
def test_the_front_keeps_vision_files_as_large_as_the_stacks_job_reads(front_plans: dict[str, Plan], tier: str) -> None:
    """Issue 57 on the tiers: the HTTP function serves `vision` uploads up to the job's input.max_image_bytes
    (LLM_BATCH_MAX_IMAGE_BYTES, read back by the front into its Limits); the tick, which takes no upload, has none."""
    from infra.config import load_stack_config
    from workload.batch_api.lambda_front import max_image_bytes_from_env

    job = load_stack_config(tier, {"cost_center": "cc"}).job_config("s3://b/i/", "s3://b/o/")
    functions = (_named(front_plans[tier], "aws:lambda/function:Function", f"batch-api-{f}") for f in ("http", "tick"))
    http, tick = (function["inputs"]["environment"]["variables"] for function in functions)
    assert max_image_bytes_from_env(http) == job.input.max_image_bytes == 8 << 20
    assert "LLM_BATCH_MAX_IMAGE_BYTES" not in tick


ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"


def _watch(plan: Plan) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The Observability component's alarms by name, and its dashboard's widgets by title."""
    observability = component(plan, "llmbatch:observability:Observability", "observability")
    alarms = {item["inputs"]["name"]: item for item in children(plan, observability, ALARM)}
    (dashboard,) = children(plan, observability, "aws:cloudwatch/dashboard:Dashboard")
    body = json.loads(dashboard["inputs"]["dashboardBody"])
    return alarms, {widget["properties"]["title"]: widget["properties"] for widget in body["widgets"]}


def test_the_queues_alarms_and_graphs_come_with_the_front_and_read_what_its_functions_publish(
    plan_for: Callable[[str], Plan], front_plans: dict[str, Plan]
) -> None:
    for tier, plan in front_plans.items():
        alarms, widgets = _watch(plan)
        # The namespace the job's alarms read is the one the functions are told to publish to.
        namespace = alarms[naming.child(tier, "gpu-underused")]["inputs"]["namespace"]
        for function in ("batch-api-http", "batch-api-tick"):
            env = _named(plan, "aws:lambda/function:Function", function)["inputs"]["environment"]["variables"]
            assert (env["LLM_BATCH_METRICS_NAMESPACE"], env["LLM_BATCH_STACK"]) == (namespace, tier)
        topic = next(item for item in plan if item["type"] == "aws:sns/topic:Topic" and item["name"] == "alerts-topic")
        for key, metric in (("batch-api-failed", mn.BATCH_API_FAILED), ("batch-api-expired", mn.BATCH_API_EXPIRED)):
            alarm = alarms[naming.child(tier, key)]["inputs"]
            assert (alarm["namespace"], alarm["metricName"], alarm["dimensions"]) == (
                namespace, metric.name, {mn.DIM_STACK: tier},
            )  # fmt: skip
            assert (alarm["statistic"], alarm["period"], alarm["comparisonOperator"], alarm["threshold"]) == (
                "Sum", 300, "GreaterThanThreshold", 0,
            )  # fmt: skip
            assert (alarm["evaluationPeriods"], alarm["treatMissingData"]) == (1, "notBreaching")
            assert alarm["alarmActions"] == [topic["outputs"]["arn"]] == alarm["okActions"]
            assert alarms[naming.child(tier, key)]["outputs"]["arn"] in widgets["Alarms"]["alarms"]
        # The at-risk alarm reads the tick's gauge: the most batches at risk in the period, above 0.
        risk = alarms[naming.child(tier, "batch-api-at-risk")]
        watched = {k: risk["inputs"][k] for k in ("metricName", "statistic", "namespace", "dimensions", "threshold")}
        assert watched == {
            "metricName": mn.BATCH_API_AT_RISK.name, "statistic": "Maximum", "namespace": namespace,
            "dimensions": {mn.DIM_STACK: tier}, "threshold": 0,
        }  # fmt: skip
        assert risk["inputs"]["comparisonOperator"] == "GreaterThanThreshold"
        assert risk["inputs"]["alarmActions"] == [topic["outputs"]["arn"]]
        assert risk["outputs"]["arn"] in widgets["Alarms"]["alarms"]
        queue = widgets["Batch API: queued and running batches"]["metrics"]
        closed = widgets["Batch API: failed and expired batches"]["metrics"]
        gauges = (mn.BATCH_API_QUEUED, mn.BATCH_API_RUNNING, mn.BATCH_API_AT_RISK)
        assert [line[:4] for line in queue] == [[namespace, m.name, mn.DIM_STACK, tier] for m in gauges]
        summed = [(mn.BATCH_API_FAILED.name, "Sum"), (mn.BATCH_API_EXPIRED.name, "Sum")]
        assert [(line[1], line[4]["stat"]) for line in closed] == summed
    for tier in ("small", "medium", "large"):  # off: none of it
        alarms, widgets = _watch(plan_for(tier))
        assert not [name for name in alarms if "batch-api" in name], tier
        assert not [title for title in widgets if title.startswith("Batch API")], tier
