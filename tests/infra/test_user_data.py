"""The small node's boot script, run for real by bash against stand-in `aws`, `docker`, `curl` and `chown`.

Stand-ins because no AWS account, Docker engine or instance metadata service exists here; each records its
arguments and answers as the real command would, so the script's own logic (date substitution, the token
file, the container's arguments, scaling back to 0) is what is tested.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.components.user_data import (
    SPOT_NOTICE_S,
    BootSettings,
    job_config_path,
    render_user_data,
    stop_timeout_s,
)
from infra.config import load_stack_config
from workload.contract.config import load_config, render_config

TOKEN = "hf_dont_print_me_123"
SETTINGS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-small/job-settings-AbCdEf"
TOKEN_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-small/hub-token-GhIjKl"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-batch/workload:0.1.0"
OUTPUT_PREFIX_URI = "s3://llm-batch-small-data/output/{date}/"

STUB = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0") $*" in
  "aws secretsmanager get-secret-value --secret-id {settings}"*) cat "$JOB_SETTINGS" ;;
  "aws secretsmanager get-secret-value --secret-id {token}"*)
    if [ -n "${{HUB_TOKEN:-}}" ]; then printf '%s' "$HUB_TOKEN"
    else echo "ResourceNotFoundException" >&2; exit 254; fi ;;
  "aws s3 cp"*) cp "$RUN_REQUEST" "$4" ;;
  "aws ecr get-login-password"*) echo "ecr-password" ;;
  "curl -sf -X PUT"*) echo "imds-token" ;;
  "curl -sf -o /dev/null -H"*"/spot/instance-action") exit "${{SPOT_NOTICE:-22}}" ;;
  "curl -sf -H"*"/autoscaling/target-lifecycle-state") echo "${{TARGET_STATE:-InService}}" ;;
  "curl -sf -H"*) echo "i-0123456789abcdef0" ;;
  "docker login"*) cat > /dev/null ;;
  "docker run"*) sleep "${{JOB_RUN_S:-0}}"; exit "${{JOB_EXIT:-0}}" ;;
esac
"""


def _settings(config_dir: Path, **changes: Any) -> BootSettings:
    return BootSettings(
        region="us-east-1",
        image=IMAGE,
        job_settings_secret_arn=SETTINGS_ARN,
        hub_token_secret_arn=TOKEN_ARN,
        log_group="/llm-batch/small/job",
        group_name="llm-batch-small-gpu",
        output_prefix_uri=OUTPUT_PREFIX_URI,
        config_dir=str(config_dir),
        models_dir=str(config_dir.parent / "models"),
        **changes,
    )


def _boot(
    tmp_path: Path,
    *,
    token: str | None,
    job_exit: int = 0,
    env_extra: dict[str, str] | None = None,
    **changes: Any,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("aws", "docker", "curl", "chown"):
        path = bin_dir / command
        path.write_text(STUB.format(settings=SETTINGS_ARN, token=TOKEN_ARN))
        path.chmod(0o755)
    config = load_stack_config("small", {"cost_center": "cc", "job": {"model_source": "Qwen/Qwen2.5-0.5B"}})
    job = config.job_config("s3://data/input/{date}/", "s3://data/output/{date}/", stack="small")
    settings_file = tmp_path / "job-settings.yaml"
    settings_file.write_text(render_config(job))
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(_settings(tmp_path / "etc", **changes)))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls.log"),
        "JOB_SETTINGS": str(settings_file),
        "HUB_TOKEN": token or "",
        "JOB_EXIT": str(job_exit),
        **(env_extra or {}),
    }
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    return result, tmp_path


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.log").read_text().splitlines()


def test_script_is_valid_bash(tmp_path: Path) -> None:
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(_settings(Path("/etc/llm-batch"))))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_boot_runs_the_job_with_todays_config_and_stands_down(tmp_path: Path) -> None:
    result, root = _boot(tmp_path, token=TOKEN)
    assert result.returncode == 0, result.stderr
    today = dt.datetime.now(dt.UTC).date().isoformat()
    job = load_config(job_config_path(str(root / "etc")))
    assert job.input.uri == f"s3://data/input/{today}/" and job.output.uri == f"s3://data/output/{today}/"
    assert job.model.source == "Qwen/Qwen2.5-0.5B" and job.device == "gpu"
    token_file = root / "etc" / "secrets" / "hub_token"
    assert token_file.read_text() == TOKEN
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    calls = _calls(root)
    run = next(call for call in calls if call.startswith("docker run"))
    # The run spec's mounts: the config file where the image's CMD reads it, the token's folder read-only.
    assert "--gpus all" in run and f"{IMAGE} run --config /etc/llm-batch/job.yaml" in run
    assert f"-v {root}/etc/job.yaml:/etc/llm-batch/job.yaml:ro" in run
    assert f"-v {root}/etc/secrets:/var/run/llm-batch/secrets:ro" in run
    assert f"-v {root}/models:/models " in run and (root / "models").is_dir()
    assert "HF_TOKEN_PATH=/var/run/llm-batch/secrets/hub_token" in run
    assert "--user 1000:1000 --read-only --tmpfs /tmp:" in run
    assert "--log-opt awslogs-group=/llm-batch/small/job" in run
    assert f"awslogs-stream={today}/i-0123456789abcdef0" in run
    assert f"chown -R 1000:1000 {root}/etc" in calls
    assert (
        calls[-1] == "aws autoscaling set-desired-capacity --auto-scaling-group-name llm-batch-small-gpu "
        "--desired-capacity 0"
    )
    # The token is only ever in its file: not in a command line, not in the script's output.
    assert all(TOKEN not in call for call in calls)
    assert TOKEN not in result.stdout + result.stderr


def test_a_batch_run_request_runs_the_job_on_the_batchs_file_and_output(tmp_path: Path) -> None:
    """The state machine's PlanBatch writes the batch's URIs into the run request; the job gets them as flags."""
    request = tmp_path / "run-request.json"
    batch_in, batch_out = "s3://data/batch-api/files/file-1/body", "s3://data/batch-api/batches/batch_1/output"
    request.write_text(
        json.dumps({"date": "2026-12-02", "batch_id": "batch_1", "input_uri": batch_in, "output_uri": batch_out})
    )
    result, root = _boot(
        tmp_path, token=None, env_extra={"RUN_REQUEST": str(request)}, run_request_uri="s3://data/control/run.json"
    )
    assert result.returncode == 0, result.stderr
    run = next(call for call in _calls(root) if call.startswith("docker run"))
    # Without the night's job.image_prefix: the operator's images are no tenant's.
    assert run.endswith(
        f"run --config /etc/llm-batch/job.yaml --input {batch_in} --output {batch_out} --no-image-prefix"
    )
    assert "awslogs-stream=2026-12-02/" in run


def test_boot_without_a_token_and_a_failing_job_still_stands_down(tmp_path: Path) -> None:
    """The job failed and wrote its own marker (the stand-in's head-object finds it): that one is kept."""
    result, root = _boot(tmp_path, token=None, job_exit=1)
    assert result.returncode == 1, result.stderr
    assert not (root / "etc" / "secrets" / "hub_token").exists()
    assert not (root / "etc" / "secrets" / "hub_token.tmp").exists()
    assert "llm-batch job exited with status 1" in result.stdout
    assert "the job recorded its own failure" in result.stdout
    calls = _calls(root)
    assert not any(call.startswith("aws s3api put-object") for call in calls)
    assert calls[-1].startswith("aws autoscaling set-desired-capacity")


def test_job_settings_render_round_trips() -> None:
    config = load_stack_config("small", {"cost_center": "cc"})
    job = config.job_config("s3://b/input/{date}/", "s3://b/output/{date}/", stack="small")
    assert yaml.safe_load(render_config(job))["input"]["uri"] == "s3://b/input/{date}/"


@pytest.mark.parametrize("hostile", ["x'; rm -rf / #", "$(reboot)"])
def test_values_are_quoted(tmp_path: Path, hostile: str) -> None:
    settings = BootSettings(
        region="us-east-1",
        image=IMAGE,
        job_settings_secret_arn=hostile,
        hub_token_secret_arn=TOKEN_ARN,
        log_group="/llm-batch/small/job",
        group_name="g",
        output_prefix_uri=OUTPUT_PREFIX_URI,
    )
    script = render_user_data(settings)
    assert f"--secret-id {hostile} " not in script
    path = tmp_path / "s.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def _docker_run(root: Path) -> str:
    return next(call for call in _calls(root) if call.startswith("docker run"))


def test_the_container_runs_under_an_init_and_outlasts_the_jobs_grace_period(tmp_path: Path) -> None:
    result, root = _boot(tmp_path, token=None)
    assert result.returncode == 0, result.stderr
    run = _docker_run(root)
    # An init as PID 1 reaps Ray's and vLLM's children; its argument comes before the image.
    assert run.startswith("docker run --init ")
    job = load_config(job_config_path(str(root / "etc")))
    timeout = int(run.split("--stop-timeout ", 1)[1].split()[0])
    assert job.resume.grace_period_s < timeout <= SPOT_NOTICE_S
    # No Spot notice came, so nothing stopped the job early.
    assert not any(call.startswith("docker stop") for call in _calls(root))


def test_a_spot_notice_stops_the_job_with_time_to_finish(tmp_path: Path) -> None:
    """The watcher sees the notice while the job runs and stops it with the full timeout, not Docker's 10 s."""
    result, root = _boot(tmp_path, token=None, spot_poll_s=1, env_extra={"SPOT_NOTICE": "0", "JOB_RUN_S": "4"})
    assert result.returncode == 0, result.stderr
    calls = _calls(root)
    stop = f"docker stop --time {stop_timeout_s(90.0, 1)} llm-batch-job"
    assert stop in calls and stop_timeout_s(90.0, 1) == 110
    assert any(call.endswith("/latest/meta-data/spot/instance-action") for call in calls)
    assert "Spot interruption notice" in result.stdout
    assert calls.index(stop) > calls.index(_docker_run(root))
    # Capacity rebalancing's replacement runs the rest: an interrupted node neither releases nor fails the run.
    assert not any(call.startswith("aws autoscaling") for call in calls)
    assert not any(call.startswith("aws s3api put-object") for call in calls)
    assert "leaving the group's capacity to the replacement" in result.stdout


def test_without_a_notice_the_watcher_polls_and_goes_with_the_job(tmp_path: Path) -> None:
    started = dt.datetime.now(dt.UTC)
    result, root = _boot(tmp_path, token=None, spot_poll_s=1, env_extra={"JOB_RUN_S": "3"})
    elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
    assert result.returncode == 0, result.stderr
    calls = _calls(root)
    assert sum(call.endswith("/spot/instance-action") for call in calls) >= 1
    assert not any(call.startswith("docker stop") for call in calls)
    # The script does not wait out a poll once the job is done.
    assert elapsed < 15
    assert calls[-1].startswith("aws autoscaling set-desired-capacity")


def test_the_stop_timeout_follows_the_jobs_grace_period() -> None:
    config = load_stack_config(
        "small", {"cost_center": "cc", "job": {"job_overrides": {"resume": {"grace_period_s": 60}}}}
    )
    assert config.job_grace_period_s == 60
    assert config.job_config("s3://b/i/", "s3://b/o/").resume.grace_period_s == 60
    script = render_user_data(_settings(Path("/etc/llm-batch"), grace_period_s=config.job_grace_period_s))
    assert "--stop-timeout 80 " in script and "docker stop --time 80 llm-batch-job" in script
    assert load_stack_config("small", {"cost_center": "cc"}).job_grace_period_s == 90


def test_a_grace_period_spots_notice_cannot_cover_is_refused() -> None:
    with pytest.raises(ValueError, match=r"resume.grace_period_s \(100.0\).*more than the 115 s left"):
        _settings(Path("/etc/llm-batch"), grace_period_s=100.0)


def test_the_small_plans_node_boots_with_init_and_the_timeout(plan_for: Any) -> None:
    (template,) = [item for item in plan_for("small") if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    script = base64.b64decode(template["inputs"]["userData"]).decode()
    assert "docker run --init " in script
    assert "--stop-timeout 110 " in script and "docker stop --time 110 llm-batch-job" in script
