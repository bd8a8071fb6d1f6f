"""Every command's error boundary: a common mistake gives one line naming the problem and the fix, a documented exit
code, and no traceback unless --debug asks for one.

The commands run in this process through the same `run_command` their `python -m` entry points use (one runs as a
real subprocess, to show the entry point is wired). AWS answers come from the session's moto server; the "no
credentials" and "unreachable endpoint" cases take the moto environment away.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from infra.ops import plan as plan_tool
from infra.ops import preflight, run, status
from infra.ops import stacks as stacks_module
from workload.cli import commands as workload_cli
from workload.contract.cli_errors import EXIT_AWS, EXIT_BAD_INPUT, run_command

ROOT = Path(__file__).resolve().parent.parent
NO_AWS = {
    "AWS_ACCESS_KEY_ID": None,
    "AWS_SECRET_ACCESS_KEY": None,
    "AWS_SESSION_TOKEN": None,
    "AWS_PROFILE": None,
    "AWS_ENDPOINT_URL": None,
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata lookup (and its timeout) on a machine without one
    "AWS_MAX_ATTEMPTS": "1",
}


def _command(
    main: Callable[[list[str]], int | None], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = run_command("cmd", main, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_clean_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def outputs_file(tmp_path: Path) -> Path:
    path = tmp_path / "outputs.json"
    arn = "arn:aws:states:us-east-1:123456789012:stateMachine:llm-batch-small-nightly"
    path.write_text(json.dumps({"nightly_state_machine_arn": arn, "data_bucket": "b", "region": "us-east-1"}))
    return path


def _without_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    # A command is a fresh process; in this one boto3's default session may hold an earlier test's credentials.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    for key, value in NO_AWS.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def test_missing_credentials(
    outputs_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_aws(monkeypatch)
    code, _, err = _command(run.main, ["small", "--outputs", str(outputs_file)], capsys)
    assert code == EXIT_AWS
    assert "no AWS credentials found; set AWS_PROFILE" in _one_clean_line(err)
    code, _, err = _command(preflight.main, ["small"], capsys)
    line = _one_clean_line(err)
    assert code == EXIT_AWS and "L-3819A6DF" in line and "no AWS credentials found" in line


def test_unreachable_endpoint(
    outputs_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_aws(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    code, _, err = _command(status.main, ["small", "--outputs", str(outputs_file)], capsys)
    line = _one_clean_line(err)
    assert code == EXIT_AWS and "cannot reach AWS" in line and "AWS_ENDPOINT_URL" in line


def test_an_aws_error_names_the_call_and_the_code(
    moto_reset: str, outputs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _command(status.main, ["small", "--outputs", str(outputs_file)], capsys)
    line = _one_clean_line(err)
    assert code == EXIT_AWS and "AWS refused ListExecutions: StateMachineDoesNotExist" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a: [1\n", "is not valid YAML/JSON (line 2, column 1)"), ("- 1\n- 2\n", "must hold a mapping, not list")],
    ids=["malformed", "not-a-mapping"],
)
def test_bad_job_yaml(tmp_path: Path, text: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(text)
    code, _, err = _command(workload_cli.main, ["validate", "--config", str(config)], capsys)
    assert code == EXIT_BAD_INPUT and expected in _one_clean_line(err)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("config: [1\n", "malformed YAML at line 2"), ("- 1\n", "must hold a mapping with a `config:` key, not a list")],
    ids=["malformed", "not-a-mapping"],
)
def test_bad_stack_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "Pulumi.broken.yaml").write_text(text)
    monkeypatch.setattr(stacks_module, "STACKS_DIR", tmp_path)
    code, _, err = _command(preflight.main, ["broken"], capsys)
    assert code == EXIT_BAD_INPUT and expected in _one_clean_line(err)


def test_unknown_stack(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _command(preflight.main, ["nosuch"], capsys)
    line = _one_clean_line(err)
    assert (
        code == EXIT_BAD_INPUT
        and "no stack file stacks/Pulumi.nosuch.yaml; stacks: large, large-70b, large-moe, medium, small" in line
    )


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _command(status.main, ["small", "--outputs", str(tmp_path / "none.json")], capsys)
    assert code == EXIT_BAD_INPUT and "none.json does not exist" in _one_clean_line(err)
    code, _, err = _command(workload_cli.main, ["validate", "--config", str(tmp_path / "none.yaml")], capsys)
    assert code == EXIT_BAD_INPUT and "config file not found" in _one_clean_line(err)
    code, _, err = _command(workload_cli.main, ["show", str(tmp_path / "no-run")], capsys)
    assert code == EXIT_BAD_INPUT and "no run output at" in _one_clean_line(err)


def test_missing_price(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Preflight cannot size quotas without the instance table: it stops, naming the refresh command."""
    (tmp_path / "Pulumi.eu.yaml").write_text(
        "config:\n  llm-batch:tier: small\n  llm-batch:cost_center: cc\n  llm-batch:region: eu-west-1\n"
    )
    monkeypatch.setattr(stacks_module, "STACKS_DIR", tmp_path)
    code, _, err = _command(preflight.main, ["eu"], capsys)
    line = _one_clean_line(err)
    assert code == EXIT_BAD_INPUT and "python -m infra.pricing.refresh --region eu-west-1" in line


def test_unexpected_errors_say_so_and_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(argv: list[str]) -> int:
        raise KeyError("surprise")

    code, _, err = _command(broken, [], capsys)
    assert code == 1 and "unexpected error: KeyError: 'surprise'" in _one_clean_line(err)
    code, _, err = _command(broken, ["--debug"], capsys)
    assert code == 1 and "Traceback" in err and 'raise KeyError("surprise")' in err


def test_the_entry_points_use_the_boundary(tmp_path: Path) -> None:
    """As a user runs them: `python -m infra.plan` and `python -m workload`, plain and with --debug."""
    plain = subprocess.run(
        [sys.executable, "-m", "infra.plan", "nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == EXIT_BAD_INPUT and "no stack file" in _one_clean_line(plain.stderr)
    command = [sys.executable, "-m", "workload", "show", str(tmp_path / "nothing"), "--debug"]
    shown = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == EXIT_BAD_INPUT and "no run output at" in _one_clean_line(shown.stderr)


def test_the_plan_command_catches_its_own_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_tool.main(["nosuch"]) == EXIT_BAD_INPUT
    assert "no stack file" in _one_clean_line(capsys.readouterr().err)


def test_a_failed_run_is_exit_1_not_bad_input() -> None:
    """A project error that is a failure of the run itself (the engine's crash loop) carries its own exit code."""
    from workload.contract.cli_errors import EXIT_BAD_INPUT, EXIT_FAILED, describe
    from workload.contract.config import ConfigError
    from workload.files.results import EngineCrashLoopError

    assert describe(EngineCrashLoopError("every row of a batch killed the engine")).exit_code == EXIT_FAILED
    assert describe(ConfigError("engine.max_num_seqs: must be at least 1")).exit_code == EXIT_BAD_INPUT
