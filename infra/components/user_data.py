"""The small tier's boot script: fetch the job's settings and token, run the job image, then stand down.

However it ends, the script leaves the nightly run something to read and the GPU released: a failure before
or during the job writes `_failed.json` under the night's output prefix (unless the job wrote its own, with
its reason) and sets the group's desired capacity to 0. The exceptions are interruptions, after which the
replacement instance that capacity rebalancing has started runs the rest (setting 0 could terminate it):

- a Spot interruption notice in the instance metadata: the script stops the job, which commits what it
  finished and writes `_interrupted.json`;
- the job stopped by SIGTERM from elsewhere, exit 143 with `_interrupted.json` under the night's output: with
  capacity rebalancing on, Auto Scaling launches the replacement and then terminates the old node itself, with
  no Spot notice, and the OS's shutdown stops the container. That is an interruption, not a failure.

And before it stands the group down at all, the node reads its Auto Scaling target lifecycle state from the
instance metadata (AWS's capacity-rebalancing guide): `Terminated` means Auto Scaling is taking this instance
away (a rebalancing replacement, a scale-in) and the group's capacity is not this node's to change.

With the Batch API's queue (`next_run_hold_s` > 0) a job that ended well does not end the boot at once: the
node watches the run request for a new one (another batch id, or another output) for up to the hold, which is
two of the nightly machine's polls and a margin (infra/statemachines/timing.py), and runs it with the image it
pulled and the model on its disk; a failed or interrupted job never holds.

Kept apart from the component so it can be rendered, and run against stand-in commands, without Pulumi.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from workload.contract import entrypoint
from workload.contract.config import ResumeConfig
from workload.contract.entrypoint import JOB_GID, JOB_UID, STOP_MARGIN_S

CONFIG_DIR = "/etc/llm-batch"
# The node's model cache, mounted at /models in the job's container (the job image's user owns it): on the
# instance's local NVMe where the type has instance store (see `prepare_model_disk`), else on the root volume.
MODELS_DIR = "/var/lib/llm-batch/models"
# Where the Deep Learning AMIs mount the instance store themselves on the types that have it (their release
# notes' `nvme_location`); where it is already mounted the boot script uses it rather than formatting the disks.
DLAMI_NVME_MOUNT = "/opt/dlami/nvme"
# The model in what EC2 reports for an instance-store NVMe device (EBS volumes report "Amazon Elastic Block Store").
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
CONTAINER = "llm-batch-job"
# Spot gives two minutes' notice. The boot script polls for it and stops the container at once, giving the job
# its own grace period (`resume.grace_period_s`) plus the run spec's margin for Ray and vLLM to exit.
SPOT_NOTICE_S = 120
SPOT_POLL_S = 5
# Between looks for the queue's next run request while the node holds on (one small S3 GET each).
NEXT_RUN_POLL_S = 10
DEFAULT_GRACE_PERIOD_S = ResumeConfig().grace_period_s
# The job's own failure marker (workload.job.output.FAILURE); the state machine looks for it under the output.
FAILURE_MARKER = "_failed.json"
# The job's note that SIGTERM stopped it after committing what it finished (workload.job.output.INTERRUPTED).
INTERRUPTED_MARKER = "_interrupted.json"
# What `docker run` returns for a container stopped by SIGTERM (128 + 15).
SIGTERM_EXIT = 143
# The job's exit codes when another attempt owns the night's output (workload/cli/commands.py EXIT_LEASE_HELD and
# EXIT_LEASE_LOST): the output is not this node's to mark failed. tests/infra/test_boot_failure.py keeps them equal.
LEASE_HELD_EXIT = 4
LEASE_LOST_EXIT = 5
# The job refused to run (config or input changed since the output was begun, EXIT_OUTPUT_MISMATCH) and left the
# output's rows as they were. The job names the refusal in `_failed.json` itself (what changed); where it left none
# (an image from before that), the node records the refusal by name there: without it the nightly machine
# sees no marker, sets the group back to 1 on its next poll and boots a GPU every cycle until its deadline (issue
# 59). The note ends this run only: the machine deletes it when a run starts (ClearStaleFailure), so a rerun with
# the output's settings and input resumes.
OUTPUT_MISMATCH_EXIT = 3


@dataclass(frozen=True)
class BootSettings:
    region: str
    image: str  # <registry>/<repository>:<tag>
    job_settings_secret_arn: str
    hub_token_secret_arn: str
    log_group: str
    group_name: str  # the Auto Scaling group to scale back to 0 when the job ends
    # s3://<bucket>/<output prefix> with `{date}` once: where the night's `_failed.json` goes, whatever failed
    # (the same template the job's output and the state machine's failure check are made from).
    output_prefix_uri: str
    config_dir: str = CONFIG_DIR
    models_dir: str = MODELS_DIR
    # s3:// URI of the nightly state machine's run request ({"date": ...}); empty: no nightly run.
    run_request_uri: str = ""
    # The job's `resume.grace_period_s`: what it needs between SIGTERM and its exit.
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    # Seconds between looks at the instance metadata for a Spot interruption notice.
    spot_poll_s: int = SPOT_POLL_S
    # With the Batch API's queue: how long the node waits, after a job ended well, for a new run request (the
    # queue's next batch or night, written by the same execution) before it stands down; 0: it stands down at
    # once, as without a queue. infra/statemachines/timing.py derives it from the machine's poll interval.
    next_run_hold_s: int = 0
    next_run_poll_s: int = NEXT_RUN_POLL_S

    def __post_init__(self) -> None:
        stop_timeout_s(self.grace_period_s, self.spot_poll_s)
        failure_marker(self.output_prefix_uri)
        if self.next_run_hold_s < 0 or self.next_run_poll_s < 1:
            raise ValueError("next_run_hold_s must be >= 0 and next_run_poll_s >= 1 (seconds)")
        if self.next_run_hold_s and not self.run_request_uri:
            raise ValueError("next_run_hold_s needs run_request_uri: the node waits for a new run request there")

    @property
    def stop_timeout_s(self) -> int:
        return stop_timeout_s(self.grace_period_s, self.spot_poll_s)


def stop_timeout_s(grace_period_s: float, spot_poll_s: int = SPOT_POLL_S) -> int:
    """Docker's wait between SIGTERM and SIGKILL: above the job's grace period, within Spot's notice."""
    timeout = entrypoint.stop_timeout_s(grace_period_s)
    room = SPOT_NOTICE_S - spot_poll_s
    if timeout > room:
        raise ValueError(
            f"resume.grace_period_s ({grace_period_s}) + {STOP_MARGIN_S} s to stop Ray and vLLM is {timeout} s, "
            f"more than the {room} s left of Spot's {SPOT_NOTICE_S} s notice once it is seen (polled every "
            f"{spot_poll_s} s); lower the job's resume.grace_period_s"
        )
    return timeout


@dataclass(frozen=True)
class FailureMarker:
    """Where a night's `_failed.json` lies: `s3://<bucket>/<key_before><date><key_after>`."""

    bucket: str
    key_before: str
    key_after: str

    def key(self, date: str) -> str:
        return f"{self.key_before}{date}{self.key_after}"


def failure_marker(output_prefix_uri: str) -> FailureMarker:
    """The failure marker of an output prefix template; refuses one the state machine could not find."""
    if not output_prefix_uri.startswith("s3://") or output_prefix_uri.count("{date}") != 1:
        raise ValueError(
            f"output_prefix_uri {output_prefix_uri!r} must be s3://<bucket>/<prefix> with {{date}} exactly once"
        )
    bucket, _, prefix = output_prefix_uri.removeprefix("s3://").partition("/")
    if not bucket or not prefix.endswith("/") or "{date}" not in prefix:
        raise ValueError(f"output_prefix_uri {output_prefix_uri!r} must name a bucket and a prefix ending in '/'")
    before, _, after = prefix.partition("{date}")
    return FailureMarker(bucket=bucket, key_before=before, key_after=f"{after}{FAILURE_MARKER}")


def job_config_path(config_dir: str = CONFIG_DIR) -> str:
    return f"{config_dir}/job.yaml"


def render_user_data(settings: BootSettings) -> str:
    """A bash script for cloud-init. It never echoes a secret (no `set -x`; values go to root-only files)."""
    q = {key: shlex.quote(str(value)) for key, value in vars(settings).items()}
    stop = settings.stop_timeout_s
    registry = shlex.quote(settings.image.split("/", 1)[0])
    config_dir = q["config_dir"]
    job_config = shlex.quote(job_config_path(settings.config_dir))
    token = shlex.quote(f"{settings.config_dir}/secrets/hub_token")
    models_dir = q["models_dir"]
    # The run spec (workload/contract/entrypoint.py): user, read-only root, scratch tmpfs, mounts, environment, stop
    # timeout.
    host = entrypoint.HostPaths(
        models=settings.models_dir,
        config=job_config_path(settings.config_dir),
        secrets=f"{settings.config_dir}/secrets",
    )
    run_spec = " ".join(shlex.quote(flag) for flag in entrypoint.docker_run_flags(host, stop))
    run_args = " ".join(shlex.quote(arg) for arg in entrypoint.run_args())
    notice = shlex.quote(f"{settings.config_dir}/spot-notice")
    marker = failure_marker(settings.output_prefix_uri)
    marker_bucket = shlex.quote(marker.bucket)
    marker_key = f'{shlex.quote(marker.key_before)}"${{night}}"{shlex.quote(marker.key_after)}'
    interrupted_after = marker.key_after.removesuffix(FAILURE_MARKER) + INTERRUPTED_MARKER
    interrupted_key = f'{shlex.quote(marker.key_before)}"${{RUN_DATE}}"{shlex.quote(interrupted_after)}'
    lease_held, lease_lost, sigterm = LEASE_HELD_EXIT, LEASE_LOST_EXIT, SIGTERM_EXIT
    refused = OUTPUT_MISMATCH_EXIT
    dlami_nvme, store_model = shlex.quote(DLAMI_NVME_MOUNT), shlex.quote(INSTANCE_STORE_MODEL)
    return f"""#!/bin/bash
# llm-batch small tier: run tonight's batch job (and, with the Batch API's queue, the runs queued after it),
# then set the group's desired capacity back to 0.
set -euo pipefail
umask 077
export AWS_REGION={q["region"]} AWS_DEFAULT_REGION={q["region"]}
RUN_DATE=$(date -u +%F)
BATCH_ARGS=()
STAGE="preparing the instance"
WATCHER=""
INSTANCE_ID=""

# Whatever ends this script (a failed step under `set -e`, the job's exit) comes through here: the nightly
# run learns of a failure at once from _failed.json, and the GPU stops costing money.
record_failure() {{
  local status="$1" night="${{RUN_DATE}}" reason="${{2:-}}" body
  [[ "${{night}}" =~ ^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}$ ]] || night=$(date -u +%F)
  local key={marker_key}
  if [ "${{STAGE}}" = "running the job" ] && \\
    aws s3api head-object --bucket {marker_bucket} --key "${{key}}" > /dev/null 2>&1; then
    echo "llm-batch: the job recorded its own failure in s3://"{marker_bucket}"/${{key}}"
    return 0
  fi
  [ -n "${{reason}}" ] || reason="the boot script failed while ${{STAGE}} (exit status ${{status}})"
  body=$(mktemp)
  printf '{{"reason": "%s", "stage": "%s", "exit_status": %d, "instance_id": "%s", "date": "%s"}}\\n' \\
    "${{reason}}" "${{STAGE}}" "${{status}}" "${{INSTANCE_ID}}" "${{night}}" > "${{body}}"
  aws s3api put-object --bucket {marker_bucket} --key "${{key}}" --body "${{body}}" \\
    --content-type application/json --metadata "{{\\"reason\\": \\"${{reason}}\\"}}" > /dev/null \\
    && echo "llm-batch: recorded the failure in s3://"{marker_bucket}"/${{key}}"
  rm -f "${{body}}"
}}

# Auto Scaling's intent for this instance (InService, Terminated, ...), read from the instance metadata; empty
# when the metadata cannot be read.
target_lifecycle_state() {{
  local imds
  imds=$(curl -sf -X PUT http://169.254.169.254/latest/api/token \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 60") || return 0
  curl -sf -H "X-aws-ec2-metadata-token: ${{imds}}" \
    http://169.254.169.254/latest/meta-data/autoscaling/target-lifecycle-state || true
}}

stand_down() {{
  local status=$? state
  trap - EXIT
  set +e
  if [ -n "${{WATCHER}}" ]; then
    kill "${{WATCHER}}" 2>/dev/null
    wait "${{WATCHER}}" 2>/dev/null
  fi
  if [ -e {notice} ]; then
    # The job committed its shards and wrote _interrupted.json; capacity rebalancing has started (or will
    # start) a replacement, and setting the group to 0 now could terminate it. Spot takes this instance.
    echo "llm-batch: Spot interruption; leaving the group's capacity to the replacement instance"
    exit "${{status}}"
  fi
  if [ "${{STAGE}}" = "running the job" ] && [ "${{status}}" -eq {sigterm} ] && \
    aws s3api head-object --bucket {marker_bucket} --key {interrupted_key} > /dev/null 2>&1; then
    # Stopped by SIGTERM from outside (Auto Scaling terminating this node after launching its rebalancing
    # replacement sends no Spot notice) after committing its shards: an interruption, resumed by the replacement.
    echo "llm-batch: the job was stopped and recorded _interrupted.json; leaving the output and the group's" \
      "capacity to the replacement instance"
    exit "${{status}}"
  fi
  if [ "${{STAGE}}" = "running the job" ] && [ "${{status}}" -eq {lease_lost} ]; then
    # Another attempt took the output's lease (say, the replacement of an instance that outlived its grace):
    # the output and the group's capacity are that attempt's now.
    echo "llm-batch: the job lost its output's lease to another attempt; leaving the output and capacity to it"
    exit "${{status}}"
  fi
  if [ "${{STAGE}}" = "running the job" ] && [ "${{status}}" -eq {lease_held} ]; then
    # Still held after resume.lease_wait_s: a live attempt elsewhere owns the output. Marking it failed would
    # fail that attempt's night; this node only stands down.
    echo "llm-batch: another live attempt holds the night's output; nothing recorded on it"
  elif [ "${{STAGE}}" = "running the job" ] && [ "${{status}}" -eq {refused} ]; then
    # The job refused this output (settings or input changed) and left its rows untouched. Named in the
    # failure marker, so the machine ends the run at once instead of booting the GPU again on every poll; the
    # next run deletes the marker when it starts, and with the same settings and input resumes the output.
    echo "llm-batch: the job refused the night's output (config or input changed); recording the refusal"
    record_failure "${{status}}" "the job refused the output: its settings or input changed since the output was \
begun (exit status ${{status}}; the job's log says what changed); restore them, or write to a new output"
  elif [ "${{status}}" -ne 0 ]; then
    record_failure "${{status}}"
  fi
  state=$(target_lifecycle_state)
  if [ -n "${{state}}" ] && [ "${{state}}" != "InService" ]; then
    # Auto Scaling is taking this instance away (Terminated: a rebalancing replacement runs, or a scale-in):
    # setting the group to 0 now could terminate the replacement.
    echo "llm-batch: Auto Scaling's target lifecycle state for this instance is ${{state}}; leaving the group's" \
      "capacity alone (exit status ${{status}})"
    exit "${{status}}"
  fi
  echo "llm-batch: standing down (exit status ${{status}})"
  aws autoscaling set-desired-capacity --auto-scaling-group-name {q["group_name"]} --desired-capacity 0
  exit "${{status}}"
}}
trap stand_down EXIT

# The model cache on the fastest disk the instance has. Instance-store NVMe (a g5.xlarge has 250 GB at several
# GB/s, against the root gp3 volume's provisioned MiB/s) is empty at every boot and lost at termination, which
# suits a cache the node refills from S3: the disks are joined as RAID0 (no redundancy needed), formatted and
# mounted over the models folder. Where the AMI mounted them already, that mount is used; with none, the root
# volume holds the cache.
prepare_model_disk() {{
  install -d -m 0750 {models_dir}
  if mountpoint -q {dlami_nvme}; then
    install -d -m 0750 {dlami_nvme}/llm-batch-models
    mount --bind {dlami_nvme}/llm-batch-models {models_dir}
    echo "llm-batch: model cache on the instance store the AMI mounted at "{dlami_nvme}
    return 0
  fi
  local disks=() device
  mapfile -t disks < <(lsblk -dpn -o NAME,MODEL | awk -v model={store_model} 'index($0, model) {{print $1}}')
  if [ "${{#disks[@]}}" -eq 0 ]; then
    echo "llm-batch: no instance store on this type; the model cache stays on the root volume"
    return 0
  fi
  device="${{disks[0]}}"
  if [ "${{#disks[@]}}" -gt 1 ]; then
    device=/dev/md/llm-batch-models
    mdadm --create "${{device}}" --run --level=0 --raid-devices="${{#disks[@]}}" "${{disks[@]}}"
  fi
  mkfs.xfs -f -q "${{device}}"
  mount -o noatime "${{device}}" {models_dir}
  echo "llm-batch: model cache on ${{#disks[@]}} instance-store disk(s) at "{models_dir}
}}

install -d -m 0700 {config_dir} {config_dir}/secrets
rm -f {notice}

# The job's settings live in Secrets Manager (KMS); {{date}} in its prefixes becomes the night's date: the
# one the nightly run wrote to its run request (so a retry after midnight resumes the same output), else
# today's UTC date (a manual scale-up).
# A batch of the Batch API brings its own file and output (the state machine's PlanBatch); the job tells an
# OpenAI batch file by its first line, whose url is the batch's endpoint; the night's job.image_prefix is no
# tenant's, so a batch runs without it (--no-image-prefix). RUN_ID tells one run from the next.
take_run_request() {{
  local run_py='import json, sys; run = json.load(open(sys.argv[1])); batch = run.get("batch_id")'
  RUN_DATE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["date"])' "$1")
  RUN_ID=$(python3 -c "${{run_py}}; print(batch or run.get('output_uri') or run['date'])" "$1")
  run_py+='; flags = ["--input", run["input_uri"], "--output", run["output_uri"], "--no-image-prefix"] if batch else []'
  mapfile -t BATCH_ARGS < <(python3 -c "${{run_py}}; print(*flags, sep=chr(10))" "$1")
}}
check_run_date() {{
  if ! [[ "${{RUN_DATE}}" =~ ^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}$ ]]; then
    echo "llm-batch: the run date '${{RUN_DATE}}' is not YYYY-MM-DD" >&2
    exit 1
  fi
}}
write_job_settings() {{
  aws secretsmanager get-secret-value --secret-id {q["job_settings_secret_arn"]} \\
    --query SecretString --output text | sed "s/{{date}}/${{RUN_DATE}}/g" > {job_config} || return
  chown {JOB_UID}:{JOB_GID} {job_config}
}}
STAGE="reading the run request"
RUN_ID=""
if [ -n {q["run_request_uri"]} ] && \\
  aws s3 cp {q["run_request_uri"]} {config_dir}/run.json --only-show-errors; then
  take_run_request {config_dir}/run.json
fi
check_run_date
STAGE="reading the job settings"
write_job_settings
# The hub token is optional (public models need none); it reaches the job as a file, never as an argument.
STAGE="reading the hub token"
if aws secretsmanager get-secret-value --secret-id {q["hub_token_secret_arn"]} \\
  --query SecretString --output text > {token}.tmp 2>/dev/null; then
  mv {token}.tmp {token}
else
  rm -f {token}.tmp
fi

STAGE="pulling the job image"
aws ecr get-login-password | docker login --username AWS --password-stdin {registry}
docker pull {q["image"]}
chown -R {JOB_UID}:{JOB_GID} {config_dir}
STAGE="preparing the model disk"
prepare_model_disk
chown {JOB_UID}:{JOB_GID} {models_dir}

STAGE="reading the instance metadata"
IMDS_TOKEN=$(curl -sf -X PUT http://169.254.169.254/latest/api/token \\
  -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
INSTANCE_ID=$(curl -sf -H "X-aws-ec2-metadata-token: ${{IMDS_TOKEN}}" \\
  http://169.254.169.254/latest/meta-data/instance-id)

# Spot's interruption notice comes two minutes before the instance goes: stop the job now, with time to
# commit its finished shards (its grace period plus a margin), rather than only when the OS shuts down at the
# end of the notice, too late for that. The notice file tells stand_down to leave the capacity alone.
spot_watch() {{
  local nap=""
  trap 'kill "${{nap}}" 2>/dev/null; exit 0' TERM
  trap - EXIT
  while :; do
    sleep {q["spot_poll_s"]} & nap=$!
    wait "${{nap}}"
    local imds
    imds=$(curl -sf -X PUT http://169.254.169.254/latest/api/token \\
      -H "X-aws-ec2-metadata-token-ttl-seconds: 60") || continue
    if curl -sf -o /dev/null -H "X-aws-ec2-metadata-token: ${{imds}}" \\
      http://169.254.169.254/latest/meta-data/spot/instance-action; then
      touch {notice}
      echo "llm-batch: Spot interruption notice; stopping the job ({stop} s to finish)"
      docker stop --time {stop} {CONTAINER} || true
      return 0
    fi
  done
}}
spot_watch &
WATCHER=$!

# With the Batch API's queue the execution that ran this job writes the next run's request (another batch, or
# the night) within a poll or two of the summary, and keeps the GPU: run it on this boot, with the image pulled
# and the model on its disk. No new request within the hold (the queue was empty): stand down as before.
next_run_request() {{
  local hold={settings.next_run_hold_s} next={config_dir}/next-run.json deadline
  [ "${{hold}}" -gt 0 ] || return 1
  STAGE="waiting for the next run request"
  deadline=$(( $(date +%s) + hold ))
  while :; do
    if aws s3 cp {q["run_request_uri"]} "${{next}}" --only-show-errors 2>/dev/null; then
      local previous="${{RUN_ID}}"
      take_run_request "${{next}}"
      if [ "${{RUN_ID}}" != "${{previous}}" ]; then
        mv "${{next}}" {config_dir}/run.json
        check_run_date
        STAGE="reading the job settings"
        write_job_settings || exit  # `set -e` does not reach into a function called in a condition
        docker rm {CONTAINER} > /dev/null || true  # the last run's container still holds the name
        echo "llm-batch: the next run request (${{RUN_ID}}); running it on this boot"
        return 0
      fi
    fi
    [ "$(date +%s)" -lt "${{deadline}}" ] || break
    sleep {settings.next_run_poll_s}
  done
  echo "llm-batch: no new run request within ${{hold}} s"
  return 1
}}

STAGE="running the job"
status=0
# The run spec first (--init reaps what Ray and vLLM leave behind and passes SIGTERM on; --stop-timeout is the
# same wait for any other `docker stop`, e.g. the OS shutting Docker down), then what only this GPU host has.
while :; do
  docker run {run_spec} \\
    --name {CONTAINER} --gpus all --shm-size 16g -e AWS_REGION -e AWS_DEFAULT_REGION \\
    --log-driver awslogs --log-opt awslogs-region={q["region"]} \\
    --log-opt awslogs-group={q["log_group"]} --log-opt "awslogs-stream=${{RUN_DATE}}/${{INSTANCE_ID}}" \\
    {q["image"]} {run_args} "${{BATCH_ARGS[@]}}" || status=$?
  echo "llm-batch job exited with status ${{status}}"
  [ "${{status}}" -eq 0 ] && next_run_request || break
  STAGE="running the job"
done
# stand_down (the EXIT trap) records a failure, or releases the GPU, or leaves it to Spot's replacement.
exit "${{status}}"
"""
