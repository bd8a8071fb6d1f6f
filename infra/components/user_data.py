"""The small tier's boot script: fetch the job's settings and token, run the job image, then stand down.

Kept apart from the component so it can be rendered, and run against stand-in commands, without Pulumi.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

CONFIG_DIR = "/etc/llm-batch"
# The job image runs as this non-root user; the files it reads are given to it, readable by nobody else.
JOB_UID = 1000
# Spot gives two minutes' notice; the job's grace period (90 s by default) must fit in Docker's stop timeout.
STOP_TIMEOUT_S = 110


@dataclass(frozen=True)
class BootSettings:
    region: str
    image: str  # <registry>/<repository>:<tag>
    job_settings_secret_arn: str
    hub_token_secret_arn: str
    log_group: str
    group_name: str  # the Auto Scaling group to scale back to 0 when the job ends
    config_dir: str = CONFIG_DIR
    # s3:// URI of the nightly state machine's run request ({"date": ...}); empty: no nightly run.
    run_request_uri: str = ""


def job_config_path(config_dir: str = CONFIG_DIR) -> str:
    return f"{config_dir}/job.yaml"


def render_user_data(settings: BootSettings) -> str:
    """A bash script for cloud-init. It never echoes a secret (no `set -x`; values go to root-only files)."""
    q = {key: shlex.quote(value) for key, value in vars(settings).items()}
    registry = shlex.quote(settings.image.split("/", 1)[0])
    config_dir = q["config_dir"]
    job_config = shlex.quote(job_config_path(settings.config_dir))
    token = shlex.quote(f"{settings.config_dir}/secrets/hub_token")
    return f"""#!/bin/bash
# llm-batch small tier: run tonight's batch job once, then set the group's desired capacity back to 0.
set -euo pipefail
umask 077
export AWS_REGION={q["region"]} AWS_DEFAULT_REGION={q["region"]}
install -d -m 0700 {config_dir} {config_dir}/secrets

# The job's settings live in Secrets Manager (KMS); {{date}} in its prefixes becomes the night's date: the
# one the nightly run wrote to its run request (so a retry after midnight resumes the same output), else
# today's UTC date (a manual scale-up).
RUN_DATE=$(date -u +%F)
if [ -n {q["run_request_uri"]} ] && \
  aws s3 cp {q["run_request_uri"]} {config_dir}/run.json --only-show-errors; then
  RUN_DATE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["date"])' {config_dir}/run.json)
fi
if ! [[ "${{RUN_DATE}}" =~ ^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}$ ]]; then
  echo "llm-batch: the run date '${{RUN_DATE}}' is not YYYY-MM-DD" >&2
  exit 1
fi
aws secretsmanager get-secret-value --secret-id {q["job_settings_secret_arn"]} \\
  --query SecretString --output text | sed "s/{{date}}/${{RUN_DATE}}/g" > {job_config}
# The hub token is optional (public models need none); it reaches the job as a file, never as an argument.
if aws secretsmanager get-secret-value --secret-id {q["hub_token_secret_arn"]} \\
  --query SecretString --output text > {token}.tmp 2>/dev/null; then
  mv {token}.tmp {token}
else
  rm -f {token}.tmp
fi

aws ecr get-login-password | docker login --username AWS --password-stdin {registry}
docker pull {q["image"]}
chown -R {JOB_UID}:{JOB_UID} {config_dir}

IMDS_TOKEN=$(curl -sf -X PUT http://169.254.169.254/latest/api/token \\
  -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
INSTANCE_ID=$(curl -sf -H "X-aws-ec2-metadata-token: ${{IMDS_TOKEN}}" \\
  http://169.254.169.254/latest/meta-data/instance-id)

status=0
docker run --name llm-batch-job --gpus all --shm-size 16g --stop-timeout {STOP_TIMEOUT_S} \\
  -v {config_dir}:{config_dir}:ro \\
  -e AWS_REGION -e AWS_DEFAULT_REGION -e HF_TOKEN_PATH={token} -e HF_HUB_DISABLE_TELEMETRY=1 \\
  --log-driver awslogs --log-opt awslogs-region={q["region"]} \\
  --log-opt awslogs-group={q["log_group"]} --log-opt "awslogs-stream=${{RUN_DATE}}/${{INSTANCE_ID}}" \\
  {q["image"]} run --config {job_config} || status=$?
echo "llm-batch job exited with status ${{status}}"

# Done (or failed: the alarms and the nightly run's retry decide what next); stop paying for the GPU.
aws autoscaling set-desired-capacity --auto-scaling-group-name {q["group_name"]} --desired-capacity 0
"""
