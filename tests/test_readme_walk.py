"""The README's numbered steps, walked as far as they run offline: a README command that stops existing or changes
its flags fails here.

Every `python -m ...` command the README names (in code blocks and inline) is checked against its parser: the
module or subcommand exists and takes every flag written. Then the small tier's steps run in order: preflight
(with quotas recorded as `aws service-quotas list-service-quotas` prints them), plan, policy, run now with --wait and
status against the nightly state machine executing on the session's moto server, show on the run's S3 output,
and the documented way to stop a run. What needs a real account (`pulumi up`, `aws s3 cp`) is left out; the
pulumi/aws parts of a step's command are replaced by the values the moto account holds.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pyarrow as pa
import pytest

from infra import statemachines
from infra.ops import preflight, run, status
from tests.infra.nightly_aws import (
    FakeInstance,
    SmallStack,
    create_small_stack,
    create_state_machine,
    executing_state_machines,
    summary,
    wait_for,
)
from workload.cli import commands as workload_cli
from workload.job.output import OutputStore

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MODULE_MAINS = {
    "infra.plan": "infra.ops.plan",
    "infra.policy": "infra.ops.policy",
    "infra.preflight": "infra.ops.preflight",
    "infra.run": "infra.ops.run",
    "infra.status": "infra.ops.status",
    "infra.pricing.refresh": "infra.ops.refresh_prices",
    "infra.ops.deployer_policy": "infra.ops.deployer_policy",
    "workload": "workload.cli.commands",
}


def readme_commands() -> list[list[str]]:
    """Every `python -m ...` command in the README, as argv (comments and `&& ...` tails cut off)."""
    found = []
    for match in re.finditer(r"python -m [^`\n]+", README):
        text = match.group(0).split(" #")[0].split("&&")[0].strip()
        found.append(shlex.split(text))
    return found


def _help(module: str, subcommand: str | None) -> str:
    main = importlib.import_module(MODULE_MAINS[module]).main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([subcommand, "--help"] if subcommand else ["--help"])
    assert exited.value.code == 0
    return out.getvalue()


def test_the_readme_names_the_commands_of_every_step() -> None:
    modules = {argv[2] for argv in readme_commands()}
    assert {"infra.preflight", "infra.plan", "infra.policy", "infra.run", "infra.status", "workload"} <= modules
    steps = re.findall(r"^\s*(\d+)\. \*\*", README, flags=re.MULTILINE)
    assert [int(step) for step in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 10


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda argv: " ".join(argv[2:5]))
def test_every_readme_command_exists_with_its_flags(argv: list[str]) -> None:
    module = argv[2]
    assert module in MODULE_MAINS, f"the README runs {module}, which is not a command of this repo"
    subcommand = argv[3] if module == "workload" else None
    help_text = _help(module, subcommand)
    for flag in (arg.split("=")[0] for arg in argv[3:] if arg.startswith("--")):
        assert re.search(rf"(^|\s|\[){re.escape(flag)}\b", help_text), f"{' '.join(argv)}: no flag {flag}"


def _step(number: int) -> list[list[str]]:
    """The `python -m` commands of the README's step `number`."""
    body = README.split(f"\n{number}. **", 1)[1].split(f"\n{number + 1}. **", 1)[0].split("\n## ", 1)[0]
    return [shlex.split(m.split(" #")[0].strip()) for m in re.findall(r"python -m [^`\n]+", body)]


def _with_values(argv: list[str], bucket: str, night: str) -> list[str]:
    """A step's argv with its shell substitutions replaced by what the moto account holds."""
    replaced = []
    for arg in argv:
        arg = arg.replace("$(pulumi stack output -s small data_bucket)", bucket)
        replaced.append(arg.replace("$(date -u +%F)", night))
    return replaced


@pytest.fixture
def small_account(moto_reset: str, tmp_path: Path) -> Iterator[tuple[SmallStack, Path]]:
    """A moto account as `pulumi up` of the small stack leaves it, and its outputs saved as JSON."""
    with executing_state_machines(moto_reset):
        stack = create_small_stack()
        definition = statemachines.render("small.asl.json", stack.substitutions(MaxPolls=10))
        stack.state_machine_arn = create_state_machine("llm-batch-small-nightly", definition)
        outputs = tmp_path / "outputs.json"
        outputs.write_text(
            json.dumps(
                {
                    "nightly_state_machine_arn": stack.state_machine_arn,
                    "data_bucket": stack.bucket,
                    "gpu_group_name": stack.asg,
                    "region": "us-east-1",
                }
            )
        )
        yield stack, outputs


def test_walk_the_small_tier_steps(
    small_account: tuple[SmallStack, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, outputs = small_account
    night = datetime.now(UTC).date().isoformat()

    # Step 5, preflight: the quota answer recorded as the AWS CLI prints it.
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"Quotas": [{"ServiceCode": "ec2", "QuotaCode": "L-3819A6DF", "Value": 8.0}]}))
    (command,) = _step(5)
    assert preflight.main([*command[3:], "--quotas", str(quotas)]) == 0
    assert "ok       L-3819A6DF" in capsys.readouterr().out

    # Step 6, plan and policy: as a user runs them (with this interpreter as `python`).
    plan_command, policy_command = ([sys.executable, *argv[1:]] for argv in _step(6))
    planned = subprocess.run(plan_command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    assert "resources in" in planned.stdout and "Monthly cost estimate for stack small" in planned.stdout
    checked = subprocess.run(policy_command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # Step 8, upload tonight's prompts, then the empty _READY marker last: the README's `aws s3 cp` lines, done
    # with boto3 on the moto account (a night without the marker is skipped without a GPU).
    body = README.split("\n8. **", 1)[1].split("\n9. **", 1)[0]
    copies = [shlex.split(line.strip()) for line in body.splitlines() if line.strip().startswith("aws s3 cp ")]
    assert [copy[3] for copy in copies] == ["data/sample.jsonl", "-"]
    for copy in copies:
        source, destination = _with_values(copy[3:5], stack.bucket, night)
        bucket, _, key = destination.removeprefix("s3://").partition("/")
        if source == "-":  # `aws s3 cp - URI < /dev/null`: an empty object
            assert copy[5:] == ["<", "/dev/null"] and key.endswith("/_READY")
            boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=b"")
        else:
            boto3.client("s3").upload_file(str(ROOT / source), bucket, key + Path(source).name)

    # Steps 9 and 10, run now and status. One shard is already committed under tonight's output, as the job
    # leaves it; the stand-in instance writes the summary once the run asks for a node.
    store = OutputStore(f"s3://{stack.bucket}/output/{night}")
    results = pa.table({"id": ["q1", "q2"], "generated_text": ["Paris.", "4"], "finish_reason": ["stop", "stop"]})
    bad = [{"id": "q3", "error_type": "missing_prompt", "error_message": "no prompt or messages"}]
    stats = {
        "rows_ok": 2,
        "rows_failed": 1,
        "input_tokens": 9,
        "output_tokens": 3,
        "error_types": {"missing_prompt": 1},
    }
    store.commit_shard(0, results, bad, stats, attempt=1)
    instance = FakeInstance(stack, [("summary.json", {**summary(rows=3), "device": "gpu"})])
    instance.start()
    (run_command,) = _step(9)
    assert run.main([*run_command[3:], "--outputs", str(outputs), "--poll", "1"]) == 0
    ran = capsys.readouterr().out
    assert f"started the nightly run of small for {night}" in ran
    assert "waiting (elapsed, current step):" in ran and "SUCCEEDED" in ran
    assert instance.error is None
    (status_command,) = _step(10)
    assert status.main([*status_command[3:], "--outputs", str(outputs)]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out

    # Step 11, read the results.
    (show_command,) = _step(11)
    assert workload_cli.main(_with_values(show_command, stack.bucket, night)[3:]) == 0
    shown = capsys.readouterr().out
    assert "summary: 2/3 rows answered, 1 errors" in shown
    assert "errors by type: missing_prompt 1" in shown
    assert "q1  [stop]  Paris." in shown

    # Stopping a night's run, as the README says: start one that no instance answers, then stop it.
    stop = next(argv for argv in readme_commands() if "--stop" in argv)
    boto3.client("s3").upload_file(str(ROOT / "data/sample.jsonl"), bucket, "input/2026-11-01/sample.jsonl")
    boto3.client("s3").put_object(Bucket=bucket, Key="input/2026-11-01/_READY", Body=b"")
    assert run.main(["small", "--outputs", str(outputs), "--date", "2026-11-01"]) == 0
    wait_for(lambda: stack.desired_capacity() == 1, what="the run to ask for a node")
    capsys.readouterr()
    assert run.main([*stop[3:], "--outputs", str(outputs)]) == 0
    assert "stopped: manual-2026-11-01-" in capsys.readouterr().out
    assert stack.desired_capacity() == 0
    running = boto3.client("stepfunctions").list_executions(
        stateMachineArn=stack.state_machine_arn, statusFilter="RUNNING"
    )["executions"]
    assert running == []
