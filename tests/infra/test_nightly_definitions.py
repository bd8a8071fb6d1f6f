"""The nightly state machines as data: valid Amazon States Language and a graph that always releases GPUs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra import statemachines
from infra.statemachines import graph
from infra.statemachines.queue import with_queue

REPO_ROOT = Path(__file__).resolve().parents[2]
ASL_VALIDATOR = REPO_ROOT / "node_modules" / ".bin" / "asl-validator"

SMALL_SUBS: dict[str, statemachines.Substitution] = {
    "Stack": "small",
    "DataBucket": "llm-batch-small-data",
    "InputPrefix": statemachines.format_template("input/{date}/"),
    "OutputPrefix": statemachines.format_template("output/{date}/"),
    "RunRequestKey": "control/run.json",
    "AutoScalingGroup": "llm-batch-small-gpu",
    "AlertsTopic": "arn:aws:sns:us-east-1:123456789012:llm-batch-small-alerts",
    "PollSeconds": 60,
    "MaxPolls": 240,
    "MaxAttempts": 3,
    "RunDeadlineMinutes": 240,
    "StateMachineTimeoutSeconds": 15600,
}
EKS_SUBS: dict[str, statemachines.Substitution] = {
    **{key: value for key, value in SMALL_SUBS.items() if key not in ("RunRequestKey", "AutoScalingGroup")},
    "Stack": "large",
    "SubmitFunction": "arn:aws:lambda:us-east-1:123456789012:function:llm-batch-large-submit-rayjob",
}
SWEEP_SUBS: dict[str, dict[str, statemachines.Substitution]] = {
    "sweep_small.asl.json": {
        "Stack": "small",
        "AutoScalingGroup": "llm-batch-small-gpu",
        "AlertsTopic": SMALL_SUBS["AlertsTopic"],
        "NightlyStateMachine": "arn:aws:states:us-east-1:123456789012:stateMachine:llm-batch-small-nightly",
    },
    "sweep_eks.asl.json": {
        "Stack": "large",
        "SubmitFunction": EKS_SUBS["SubmitFunction"],
        "AlertsTopic": SMALL_SUBS["AlertsTopic"],
        "NightlyStateMachine": "arn:aws:states:us-east-1:123456789012:stateMachine:llm-batch-large-nightly",
    },
}
RENDERED: dict[str, dict[str, Any]] = {
    "small.asl.json": statemachines.render("small.asl.json", SMALL_SUBS),
    "eks.asl.json": statemachines.render("eks.asl.json", EKS_SUBS),
    **{name: statemachines.render(name, subs) for name, subs in SWEEP_SUBS.items()},
}
NIGHTLY_FILES = sorted(statemachines.NIGHTLY.values())
ALL_FILES = sorted([*statemachines.NIGHTLY.values(), *statemachines.SWEEP.values()])
# With the Batch API on: the same machines with the queue drain merged in (infra/statemachines/queue.py).
QUEUE_SUBS: dict[str, statemachines.Substitution] = {
    "TickFunction": "arn:aws:lambda:us-east-1:123456789012:function:llm-batch-small-batch-api-tick",
    "MaxPolls": SMALL_SUBS["MaxPolls"],
    "QueuePollBudget": 500,
}
QUEUE_TIMEOUT_S = 500 * int(SMALL_SUBS["PollSeconds"]) + 1800
QUEUED = {f"{name}+queue": name for name in NIGHTLY_FILES}
RENDERED.update({key: with_queue(RENDERED[name], QUEUE_SUBS, QUEUE_TIMEOUT_S) for key, name in QUEUED.items()})
NIGHTLY_VARIANTS = sorted([*NIGHTLY_FILES, *QUEUED])


def invalid(definitions: dict[str, dict[str, Any]], folder: Path) -> dict[str, str]:
    """asl-validator over many definitions in ONE node start (about 1.5 s each here): the names it refused, each
    with what it said. Its output gives every file a line, `✓ ... "<path>" is valid` or `✕ ... "<path>" is
    invalid:` followed by the errors."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: asl-validator (npm) needs it; `make setup` installs the npm part")
    if not ASL_VALIDATOR.exists():
        pytest.skip(f"{ASL_VALIDATOR} missing: run `make setup` (npm ci) to install asl-validator")
    paths = {}
    for index, (name, definition) in enumerate(definitions.items()):
        paths[name] = folder / f"definition-{index}.json"
        paths[name].write_text(json.dumps(definition))
    command = [str(ASL_VALIDATOR)] + [arg for path in paths.values() for arg in ("--json-path", str(path))]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    said: dict[str, list[str]] = {}
    current: str | None = None
    for line in (result.stdout + result.stderr).splitlines():
        named = [name for name, path in paths.items() if f'"{path}"' in line]
        if named and line.startswith(("\u2713", "\u2715")):
            current = named[0] if line.startswith("\u2715") else None
            if current is not None:
                said[current] = []
        elif current is not None:
            said[current].append(line)
    refused = {name: "\n".join(lines) for name, lines in said.items()}
    assert (result.returncode == 0) == (not refused), f"asl-validator exit {result.returncode}: {result.stdout}"
    return refused


def test_every_definition_file_is_listed() -> None:
    on_disk = sorted(path.name for path in statemachines.DEFINITIONS_DIR.glob("*.asl.json"))
    assert on_disk == ALL_FILES


def test_rendered_definitions_are_valid_asl_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    """Every rendered definition (the queued ones too) passes asl-validator, and the validator really checks: a
    state pointing at a missing state is refused. One validator start for all of them."""
    broken = json.loads(json.dumps(RENDERED["small.asl.json"]))
    broken["States"]["WaitForJob"]["Next"] = "NoSuchState"
    definitions = {name: RENDERED[name] for name in [*ALL_FILES, *QUEUED]}
    refused = invalid({**definitions, "broken": broken}, tmp_path)
    assert list(refused) == ["broken"], refused
    assert "NoSuchState" in refused["broken"]


@pytest.mark.parametrize("file_name", [*ALL_FILES, *QUEUED])
def test_every_task_catches_every_error(file_name: str) -> None:
    definition = RENDERED[file_name]
    tasks = graph.matching(definition, lambda state: state["Type"] == "Task")
    assert tasks
    uncaught = sorted(name for name in tasks if not graph.catches_everything(graph.states(definition)[name]))
    assert not uncaught, f"tasks without a States.ALL catch: {uncaught}"


@pytest.mark.parametrize("file_name", [*ALL_FILES, *QUEUED])
def test_every_state_is_reachable_and_every_target_exists(file_name: str) -> None:
    definition = RENDERED[file_name]
    names = set(graph.states(definition))
    for name, state in graph.states(definition).items():
        missing = set(graph.successors(state)) - names
        assert not missing, f"{name} goes to missing state(s) {missing}"
    assert graph.reachable(definition, definition["StartAt"]) == names


@pytest.mark.parametrize("file_name", NIGHTLY_VARIANTS)
def test_every_path_to_an_end_passes_through_a_release(file_name: str) -> None:
    definition = RENDERED[file_name]
    releases = graph.matching(definition, graph.is_release)
    starts = graph.matching(definition, graph.is_capacity_start)
    assert releases and starts
    # With the release states taken out, no ending can be reached once capacity may have been asked for.
    for start in starts:
        after = graph.reachable(definition, start, blocked=releases)
        endings = {name for name in after if graph.is_terminal(graph.states(definition)[name])}
        assert not endings, f"{file_name}: {endings} can be reached from {start} without releasing the GPU"
    # Before any capacity start, the only ending is the night skipped for want of input (nothing to release);
    # with the queue even a skip passes a release (a no-op unless an earlier run of the execution holds the GPUs).
    before = graph.reachable(definition, definition["StartAt"], blocked=releases | starts)
    skipped = set() if file_name in QUEUED else {"RunSkipped"}
    assert {name for name in before if graph.is_terminal(graph.states(definition)[name])} == skipped
    # ...and every state that can bring capacity up is among those that must still pass a release.
    assert starts <= graph.reachable(definition, definition["StartAt"], blocked=releases)


@pytest.mark.parametrize("file_name", NIGHTLY_VARIANTS)
def test_a_failed_release_still_notifies_and_fails(file_name: str) -> None:
    definition = RENDERED[file_name]
    for name in graph.matching(definition, graph.is_release):
        catch_targets = [catcher["Next"] for catcher in graph.states(definition)[name]["Catch"]]
        for target in catch_targets:
            after = graph.reachable(definition, target)
            assert any(
                graph.states(definition)[s]["Resource"] == "arn:aws:states:::sns:publish"
                for s in after
                if graph.states(definition)[s]["Type"] == "Task"
            ), f"{name}'s catch never reaches the alerts topic"


@pytest.mark.parametrize("file_name", NIGHTLY_FILES)
def test_an_interruption_leads_to_a_retry_that_resumes(file_name: str) -> None:
    definition = RENDERED[file_name]
    interruption_choices = graph.matching(
        definition,
        lambda state: any(rule.get("Variable") == "$.interruption_check.count" for rule in state.get("Choices", [])),
    )
    assert len(interruption_choices) == 1
    (choice,) = interruption_choices
    rule = next(
        rule for rule in graph.states(definition)[choice]["Choices"] if rule["Variable"] == "$.interruption_check.count"
    )
    releases = graph.matching(definition, graph.is_release)
    # From the interruption, the work starts again without first releasing (and ending) the run...
    after = graph.reachable(definition, rule["Next"], blocked=releases)
    assert graph.matching(definition, graph.is_capacity_start) & after
    # ...on the same output: nothing on the retry path recomputes the run's date or URIs.
    assert "PlanRun" not in after and "ResolveDate" not in after


def test_eks_retries_a_rayjob_that_failed_without_a_marker() -> None:
    definition = RENDERED["eks.asl.json"]
    ended = graph.states(definition)["RayJobEnded"]
    retry_rule = ended["Choices"][0]
    assert {"Variable": "$.rayjob_status.value.retryable", "BooleanEquals": True} in retry_rule["And"]
    releases = graph.matching(definition, graph.is_release)
    after = graph.reachable(definition, retry_rule["Next"], blocked=releases)
    assert "SubmitRayJob" in after


@pytest.mark.parametrize("file_name", NIGHTLY_FILES)
def test_every_loop_waits_and_is_bounded(file_name: str) -> None:
    definition = RENDERED[file_name]
    waits = graph.matching(definition, lambda state: state["Type"] == "Wait")
    assert waits and not graph.has_cycle(definition, removed=waits), "a loop that never waits"
    bounds = {"DeadlinePassed", "AttemptsLeft"}
    assert not graph.has_cycle(definition, removed=bounds), "a loop that no deadline or attempt limit ends"
    deadline = graph.states(definition)["DeadlinePassed"]["Choices"][0]
    assert deadline["NumericGreaterThanEquals"] == SMALL_SUBS["MaxPolls"]


@pytest.mark.parametrize("file_name", NIGHTLY_VARIANTS)
def test_the_state_machine_timeout_outlasts_the_run_deadline(file_name: str) -> None:
    """The whole-machine timeout is a backstop only: reaching it skips the release (the sweep then acts)."""
    definition = RENDERED[file_name]
    deadline_s = int(SMALL_SUBS["RunDeadlineMinutes"]) * 60
    assert definition["TimeoutSeconds"] > deadline_s


@pytest.mark.parametrize("file_name", sorted(statemachines.SWEEP.values()))
def test_sweep_releases_only_when_no_run_is_going(file_name: str) -> None:
    definition = RENDERED[file_name]
    choice = graph.states(definition)["RunGoing"]
    assert choice["Choices"][0]["Variable"] == "$.running.executions[0]"
    releases = graph.matching(definition, graph.is_release)
    assert not releases & graph.reachable(definition, choice["Choices"][0]["Next"])
    assert releases & graph.reachable(definition, choice["Default"])


@pytest.mark.parametrize("queued", sorted(QUEUED))
def test_the_queue_moves_three_edges_and_adds_its_states(queued: str) -> None:
    """Without the Batch API the machine is its file; with it, only the summary's and the skip's way on change."""
    plain, drained = graph.states(RENDERED[QUEUED[queued]]), graph.states(RENDERED[queued])
    added = {"NextBatch", "NextRunQueued", "TakeNextRun", "NextBatchAfterSkip", "NextRunQueuedAfterSkip"}
    assert set(drained) - set(plain) == added | {"ReleaseAfterSkip"}
    changed = {name for name in plain if plain[name] != drained[name]}
    assert changed == {"SummaryWritten", "NotifySkipped"}
    assert drained["SummaryWritten"]["Choices"][0]["Next"] == "NextBatch"
    assert {c["Next"] for c in drained["NotifySkipped"]["Catch"]} == {drained["NotifySkipped"]["Next"]}
    assert drained["NotifySkipped"]["Next"] == "NextBatchAfterSkip"
    assert RENDERED[queued]["TimeoutSeconds"] == QUEUE_TIMEOUT_S
    for name in ("NextBatch", "NextBatchAfterSkip"):
        asked = drained[name]["Parameters"]["Payload"]["next_batch"]
        assert (asked["max_polls"], asked["poll_budget"]) == (SMALL_SUBS["MaxPolls"], 500)
        assert drained[name]["Parameters"]["FunctionName"] == QUEUE_SUBS["TickFunction"]


@pytest.mark.parametrize("queued", sorted(QUEUED))
def test_the_next_run_keeps_the_gpus_and_a_failure_still_ends_the_execution(queued: str) -> None:
    definition = RENDERED[queued]
    states = graph.states(definition)
    releases = graph.matching(definition, graph.is_release)
    starts = graph.matching(definition, graph.is_capacity_start)
    # A run's summary leads to the next run's start without a release in between: one boot for the queue.
    assert starts & graph.reachable(definition, "NextBatch", blocked=releases)
    assert states["NextRunQueued"]["Default"] == "ReleaseAfterSuccess"
    assert states["NextRunQueuedAfterSkip"]["Default"] == "ReleaseAfterSkip"
    assert {c["Next"] for c in states["NextBatch"]["Catch"]} == {"ReleaseAfterSuccess"}
    # A failed run releases, alerts and fails: no later batch is taken on its GPUs.
    for failing in ("RecordFailure", "ReleaseAfterFailure", "JobFailed"):
        assert not {"NextBatch", "NextBatchAfterSkip"} & graph.reachable(definition, failing)
    # A loop that never waits is only the skip's (no GPU time), and the function's budget ends every loop.
    waits = graph.matching(definition, lambda state: state["Type"] == "Wait")
    assert not graph.has_cycle(definition, removed=waits | {"NextRunQueuedAfterSkip"})
    bounds = {"DeadlinePassed", "AttemptsLeft", "NextRunQueued", "NextRunQueuedAfterSkip"}
    assert not graph.has_cycle(definition, removed=bounds)
    # An interruption's retry resumes the same run: only a new NextBatch plans another.
    rule = next(
        r for r in states["InterruptionMarkerWritten"]["Choices"] if r["Variable"] == "$.interruption_check.count"
    )
    after = graph.reachable(definition, rule["Next"], blocked=releases | {"NextBatch"})
    assert "ResolveDate" not in after and starts & after


def test_the_queue_refuses_a_state_it_would_overwrite() -> None:
    clashing = json.loads(json.dumps(RENDERED["small.asl.json"]))
    clashing["States"]["NextBatch"] = {"Type": "Pass", "End": True}
    with pytest.raises(ValueError, match="NextBatch already in the definition"):
        with_queue(clashing, QUEUE_SUBS, QUEUE_TIMEOUT_S)


def test_render_refuses_missing_and_unused_substitutions() -> None:
    partial = {key: value for key, value in SMALL_SUBS.items() if key != "AutoScalingGroup"}
    with pytest.raises(ValueError, match=r"no value for placeholder.*AutoScalingGroup"):
        statemachines.render("small.asl.json", partial)
    with pytest.raises(ValueError, match="SubmitFunction are not used"):
        statemachines.render("small.asl.json", {**SMALL_SUBS, "SubmitFunction": "x"})
    with pytest.raises(ValueError, match="single quote"):
        statemachines.render("small.asl.json", {**SMALL_SUBS, "Stack": "it's"})


def test_render_keeps_types_and_fills_inside_strings() -> None:
    rendered = RENDERED["small.asl.json"]
    assert rendered["States"]["WaitForJob"]["Seconds"] == 60
    assert rendered["TimeoutSeconds"] == 15600
    plan = rendered["States"]["PlanRun"]["Parameters"]
    assert plan["output_uri.$"] == "States.Format('s3://llm-batch-small-data/output/{}/', $.date)"
    assert not statemachines.placeholders(rendered)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("output/", "exactly once"),
        ("output/{date}/{date}/", "exactly once"),
        ("output/{date}", "ending in '/'"),
        ("/output/{date}/", "relative"),
        ("out{x}/{date}/", "braces"),
    ],
)
def test_format_template_refuses_bad_prefixes(prefix: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        statemachines.format_template(prefix, key="job.output_prefix")


def test_unknown_definition_file_is_named() -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.asl\.json"):
        statemachines.load("nope.asl.json")
