"""The small node's boot script takes the night's date from the nightly run's request.

Run for real by bash against the same kind of stand-in commands as tests/infra/test_user_data.py (no AWS
account, Docker engine or instance metadata here); the stand-in `aws s3 cp` copies a local file or fails
as the real one does when the object is missing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from infra.components.user_data import BootSettings, job_config_path, render_user_data
from infra.config import load_stack_config
from workload.contract.config import load_config, render_config

RUN_REQUEST_URI = "s3://llm-batch-small-data/control/run.json"
STUB = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0") $*" in
  "aws s3 cp {uri} "*) [ -f "$RUN_REQUEST" ] && cp "$RUN_REQUEST" "$4" || exit 1 ;;
  "aws secretsmanager get-secret-value"*"job-settings"*) cat "$JOB_SETTINGS" ;;
  "aws secretsmanager get-secret-value"*) exit 254 ;;
  "aws ecr get-login-password"*) echo "ecr-password" ;;
  "curl -sf -X PUT"*) echo "imds-token" ;;
  "curl -sf -o /dev/null -H"*"/spot/instance-action") exit 22 ;;
  "curl -sf -H"*) echo "i-0123456789abcdef0" ;;
  "docker login"*) cat > /dev/null ;;
esac
"""


def _boot(tmp_path: Path, request: dict[str, str] | None) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("aws", "docker", "curl", "chown"):
        (bin_dir / command).write_text(STUB.format(uri=RUN_REQUEST_URI))
        (bin_dir / command).chmod(0o755)
    config = load_stack_config("small", {"cost_center": "cc"})
    settings_file = tmp_path / "job-settings.yaml"
    settings_file.write_text(
        render_config(config.job_config("s3://data/input/{date}/", "s3://data/output/{date}/", stack="small"))
    )
    request_file = tmp_path / "request.json"
    if request is not None:
        request_file.write_text(json.dumps(request))
    settings = BootSettings(
        region="us-east-1",
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-batch/workload:0.1.0",
        job_settings_secret_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-small/job-settings-A",
        hub_token_secret_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-small/hub-token-B",
        log_group="/llm-batch/small/job",
        group_name="llm-batch-small-gpu",
        output_prefix_uri="s3://llm-batch-small-data/output/{date}/",
        config_dir=str(tmp_path / "etc"),
    )
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(replace(settings, run_request_uri=RUN_REQUEST_URI)))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls.log"),
        "JOB_SETTINGS": str(settings_file),
        "RUN_REQUEST": str(request_file),
    }
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60), tmp_path


def test_the_night_comes_from_the_run_request(tmp_path: Path) -> None:
    """A retry that boots after midnight still resumes the night the state machine started."""
    result, root = _boot(tmp_path, {"date": "2026-11-27", "output_uri": "s3://data/output/2026-11-27/"})
    assert result.returncode == 0, result.stderr
    job = load_config(job_config_path(str(root / "etc")))
    assert job.input.uri == "s3://data/input/2026-11-27/"
    assert job.output.uri == "s3://data/output/2026-11-27/"
    assert any(call.startswith("docker run") for call in (root / "calls.log").read_text().splitlines())


def test_without_a_run_request_the_night_is_today(tmp_path: Path) -> None:
    result, root = _boot(tmp_path, None)
    assert result.returncode == 0, result.stderr
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert load_config(job_config_path(str(root / "etc"))).output.uri == f"s3://data/output/{today}/"


def test_a_malformed_date_stops_the_boot_before_the_job(tmp_path: Path) -> None:
    result, root = _boot(tmp_path, {"date": "27/11/2026; reboot"})
    assert result.returncode == 1
    assert "is not YYYY-MM-DD" in result.stderr
    assert not any(call.startswith("docker run") for call in (root / "calls.log").read_text().splitlines())
