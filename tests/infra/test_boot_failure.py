"""The small node's boot script failing for real: its own bash, the real AWS CLI, a moto server for AWS.

Only what cannot run here is a stand-in: `docker` (no engine; a failed pull is its `pull` exiting 1),
`curl` to the instance metadata service (no instance; it answers the instance id, no Spot notice, and the Auto
Scaling target lifecycle state from TARGET_STATE) and `chown` (no job user). Every AWS call the script makes
(the run request, the job settings secret, the ECR login, the failure and interruption markers, the group's
desired capacity) goes through the AWS CLI to the moto server, so the marker and the capacity are read back
from the service, not from a log of arguments. The CLI is the `awscli` of requirements/dev.lock (the dev
extra in pyproject.toml), installed beside this interpreter: a missing one fails here, it is never skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.components.user_data import BootSettings, render_user_data
from infra.config import load_stack_config
from workload.contract.config import render_config

BUCKET = "llm-batch-small-data"
GROUP = "llm-batch-small-gpu"
NIGHT = "2026-11-28"
MARKER = f"output/{NIGHT}/_failed.json"
STANDINS = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0") $*" in
  "docker login"*) cat > /dev/null ;;
  "docker pull"*) echo "Error response from daemon: manifest unknown" >&2; exit "${PULL_EXIT:-0}" ;;
  "docker run"*)
    # The nightly machine's part while a job ends well: the queue's next run request (once).
    if [ -n "${NEXT_RUN:-}" ] && [ ! -e "${NEXT_RUN}.sent" ]; then
      aws s3 cp "${NEXT_RUN}" "s3://${BUCKET}/control/run.json" --only-show-errors && touch "${NEXT_RUN}.sent"
    fi
    exit "${JOB_EXIT:-0}" ;;
  "curl -sf -X PUT"*) echo "imds-token" ;;
  "curl -sf -o /dev/null -H"*"/spot/instance-action") exit 22 ;;
  "curl -sf -H"*"/autoscaling/target-lifecycle-state") echo "${TARGET_STATE:-InService}" ;;
  "curl -sf -H"*) echo "i-0123456789abcdef0" ;;
  "lsblk"*) printf '%b' "${DISKS:-}" ;;
  "mountpoint"*) exit "${DLAMI_MOUNTED:-1}" ;;
  "mkfs.xfs"*) exit "${MKFS_EXIT:-0}" ;;
esac
"""


@pytest.fixture
def aws_cli() -> str:
    """The real `aws` command: the virtualenv's own (requirements/dev.lock), else one on PATH."""
    beside = Path(sys.executable).parent / "aws"
    found = str(beside) if beside.exists() else shutil.which("aws")
    if found is None or subprocess.run([found, "--version"], capture_output=True).returncode != 0:
        pytest.fail("no AWS CLI: install requirements/dev.lock (`make setup`), which pins awscli")
    return found


@pytest.fixture
def account(moto_reset: str) -> Iterator[dict[str, str]]:
    """What a small stack leaves in the account for the node: bucket, run request, settings secret, group at 1."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="control/run.json", Body=json.dumps({"date": NIGHT}).encode())
    config = load_stack_config("small", {"cost_center": "cc"})
    job = config.job_config(f"s3://{BUCKET}/input/{{date}}/", f"s3://{BUCKET}/output/{{date}}/", stack="small")
    secrets = boto3.client("secretsmanager")
    settings_arn = secrets.create_secret(Name="llm-batch-small/job-settings", SecretString=render_config(job))["ARN"]
    ec2 = boto3.client("ec2")
    template = ec2.create_launch_template(
        LaunchTemplateName=GROUP, LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    boto3.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        MinSize=0,
        MaxSize=1,
        DesiredCapacity=1,  # the nightly run has asked for the GPU
        AvailabilityZones=["us-east-1a"],
    )
    yield {"settings_arn": settings_arn, "endpoint": moto_reset}


def _boot(
    tmp_path: Path,
    aws_cli: str,
    account: dict[str, str],
    disks: bool = False,
    settings: dict[str, Any] | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """The boot script run for real; `disks`: the block-device commands are stand-ins too (this machine has no
    instance store to format), answering lsblk with DISKS and mountpoint with DLAMI_MOUNTED."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    disk_commands = ("lsblk", "mountpoint", "mdadm", "mkfs.xfs", "mount") if disks else ()
    for command in ("docker", "curl", "chown", *disk_commands):
        (bin_dir / command).write_text(STANDINS)
        (bin_dir / command).chmod(0o755)
    boot = BootSettings(
        region="us-east-1",
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-batch-small/workload:0123abcd",
        job_settings_secret_arn=account["settings_arn"],
        hub_token_secret_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-small/hub-token-Ab",
        log_group="/llm-batch/small/job",
        group_name=GROUP,
        output_prefix_uri=f"s3://{BUCKET}/output/{{date}}/",
        run_request_uri=f"s3://{BUCKET}/control/run.json",
        config_dir=str(tmp_path / "etc"),
        models_dir=str(tmp_path / "models"),
        **(settings or {}),
    )
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(boot))
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{Path(aws_cli).parent}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls.log"),
        "AWS_ENDPOINT_URL": account["endpoint"],
        "BUCKET": BUCKET,
        **env,
    }
    return subprocess.run(["bash", str(script)], env=environment, capture_output=True, text=True, timeout=120)


def _desired_capacity() -> int:
    groups = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
    return int(groups["AutoScalingGroups"][0]["DesiredCapacity"])


def _marker() -> tuple[dict[str, Any], dict[str, str]]:
    found = boto3.client("s3").get_object(Bucket=BUCKET, Key=MARKER)
    return json.loads(found["Body"].read()), found["Metadata"]


def test_a_failed_pull_leaves_the_marker_and_releases_the_gpu(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    result = _boot(tmp_path, aws_cli, account, PULL_EXIT="1")
    assert result.returncode == 1, result.stderr
    body, metadata = _marker()
    assert body["stage"] == "pulling the job image" and body["exit_status"] == 1 and body["date"] == NIGHT
    # The state machine reads the reason from the marker's metadata (headObject), without the body.
    assert metadata["reason"] == "the boot script failed while pulling the job image (exit status 1)"
    assert _desired_capacity() == 0
    calls = (tmp_path / "calls.log").read_text()
    assert "docker run" not in calls


def test_a_job_that_dies_without_a_word_still_fails_the_night(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    """Killed before it could write its own marker (say, out of memory): the script writes one for it."""
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="137")
    assert result.returncode == 137, result.stderr
    body, metadata = _marker()
    assert body["stage"] == "running the job" and body["exit_status"] == 137
    assert "exit status 137" in metadata["reason"]
    assert _desired_capacity() == 0


def test_the_jobs_own_failure_marker_is_kept(tmp_path: Path, aws_cli: str, account: dict[str, str]) -> None:
    s3 = boto3.client("s3")
    s3.put_object(Bucket=BUCKET, Key=MARKER, Body=b'{"reason": "input is empty"}', Metadata={"reason": "empty"})
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="2")
    assert result.returncode == 2, result.stderr
    assert _marker() == ({"reason": "input is empty"}, {"reason": "empty"})
    assert _desired_capacity() == 0


def test_the_small_plans_node_may_write_exactly_the_failure_marker(plan_for: Any) -> None:
    """The marker's place comes from the boot settings, and the node's own grant is that one key pattern."""
    import base64

    plan = plan_for("small")
    (bucket,) = [item for item in plan if item["type"] == "aws:s3/bucket:Bucket" and item["name"] == "storage-bucket"]
    name = bucket["outputs"]["bucket"]
    (stand_down,) = [item for item in plan if item["name"] == "gpu-node-stand-down"]
    statements = {s["Sid"]: s for s in json.loads(stand_down["inputs"]["policy"])["Statement"]}
    assert statements["RecordBootFailure"]["Action"] == ["s3:PutObject", "s3:GetObject"]
    assert statements["RecordBootFailure"]["Resource"] == f"arn:aws:s3:::{name}/output/*/_failed.json"
    (template,) = [item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    script = base64.b64decode(template["inputs"]["userData"]).decode()
    assert 'local key=output/"${night}"/_failed.json' in script
    assert f'put-object --bucket {name} --key "${{key}}"' in script
    assert "trap stand_down EXIT" in script


def test_lease_exit_codes_are_the_jobs() -> None:
    from infra.components import user_data
    from workload.cli import commands as cli

    assert (user_data.LEASE_HELD_EXIT, user_data.LEASE_LOST_EXIT) == (cli.EXIT_LEASE_HELD, cli.EXIT_LEASE_LOST)
    assert user_data.OUTPUT_MISMATCH_EXIT == cli.EXIT_OUTPUT_MISMATCH


def test_a_refused_rerun_is_a_named_failure(tmp_path: Path, aws_cli: str, account: dict[str, str]) -> None:
    """The job refused the output (exit 3: config or input changed): the node names the refusal in the failure
    marker, which the machine reads at once (ReadFailureReason, tests/infra/test_nightly_execution.py), instead of
    leaving no marker and being booted again on every poll until the deadline (issue 59, finding 1)."""
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="3")
    assert result.returncode == 3, result.stderr
    assert "refused the night's output" in result.stdout
    body, metadata = _marker()
    assert body["stage"] == "running the job" and body["exit_status"] == 3 and body["date"] == NIGHT
    assert metadata["reason"].startswith("the job refused the output: its settings or input changed"), metadata
    assert "exit status 3" in metadata["reason"]
    assert _desired_capacity() == 0


def test_a_job_refused_by_a_live_lease_marks_nothing(tmp_path: Path, aws_cli: str, account: dict[str, str]) -> None:
    """Another attempt owns tonight's output: no _failed.json lands on it; this node stands down."""
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="4")
    assert result.returncode == 4, result.stderr
    assert "nothing recorded on it" in result.stdout
    assert boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=MARKER)["KeyCount"] == 0
    assert _desired_capacity() == 0


def test_a_job_that_lost_its_lease_leaves_output_and_capacity_alone(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    before = _desired_capacity()
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="5")
    assert result.returncode == 5, result.stderr
    assert boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=MARKER)["KeyCount"] == 0
    assert _desired_capacity() == before


INTERRUPTED = f"output/{NIGHT}/_interrupted.json"


def _interrupted_note() -> None:
    """What the job leaves when SIGTERM stops it after committing its finished shards."""
    boto3.client("s3").put_object(Bucket=BUCKET, Key=INTERRUPTED, Body=b'{"signal": "SIGTERM", "shards_left": 3}')


def _no_failure_marker() -> bool:
    return int(boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=MARKER)["KeyCount"]) == 0


def test_rebalancing_termination_is_an_interruption_not_a_failure(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    """Capacity rebalancing: Auto Scaling runs the replacement, then terminates this node itself (no Spot notice).

    The job stops on SIGTERM, writes _interrupted.json, exits 143; the node must neither fail the night nor set
    the group to 0, which would terminate the replacement (issue 33).
    """
    _interrupted_note()
    before = _desired_capacity()
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="143", TARGET_STATE="Terminated")
    assert result.returncode == 143, result.stderr
    assert "recorded _interrupted.json; leaving the output and the group's capacity" in result.stdout
    assert _no_failure_marker()
    assert _desired_capacity() == before == 1


def test_sigterm_without_the_note_is_a_failure(tmp_path: Path, aws_cli: str, account: dict[str, str]) -> None:
    """Killed by SIGTERM before it could commit and write its note: the night did fail."""
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="143")
    assert result.returncode == 143, result.stderr
    body, _ = _marker()
    assert body["stage"] == "running the job" and body["exit_status"] == 143
    assert _desired_capacity() == 0


def test_a_node_auto_scaling_is_terminating_leaves_the_capacity_alone(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    """The job failed, but Auto Scaling's target state for this node is Terminated: the group is not its to change."""
    result = _boot(tmp_path, aws_cli, account, JOB_EXIT="1", TARGET_STATE="Terminated")
    assert result.returncode == 1, result.stderr
    assert "target lifecycle state for this instance is Terminated; leaving the group's capacity alone" in result.stdout
    body, _ = _marker()
    assert body["exit_status"] == 1  # the failure itself is still recorded
    assert _desired_capacity() == 1
    calls = (tmp_path / "calls.log").read_text()
    assert "/latest/meta-data/autoscaling/target-lifecycle-state" in calls


def test_the_interruption_marker_is_the_jobs_and_the_node_may_read_it(plan_for: Any) -> None:
    from infra.components import user_data
    from workload.job import output

    assert user_data.INTERRUPTED_MARKER == output.INTERRUPTED
    plan = plan_for("small")
    (bucket,) = [item for item in plan if item["type"] == "aws:s3/bucket:Bucket" and item["name"] == "storage-bucket"]
    name = bucket["outputs"]["bucket"]
    (job_policy,) = [item for item in plan if item["name"] == "job-access-policy"]
    reads = [
        s
        for s in json.loads(job_policy["inputs"]["policy"])["Statement"]
        if s["Sid"] == "ReadInputsModelsAndOwnOutputs"
    ]
    assert reads[0]["Action"] == ["s3:GetObject"] and f"arn:aws:s3:::{name}/output/*" in reads[0]["Resource"]


STORE = "Amazon EC2 NVMe Instance Storage"


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.log").read_text().splitlines()


def test_two_instance_store_disks_become_one_model_cache_for_every_run_of_the_boot(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    """A p4d-like node: its NVMe instance-store disks (not the EBS root) are striped, formatted and mounted over
    the models folder before the job starts. With the Batch API's queue the boot then holds on: the machine
    writes the next batch's run request while the night's job ends well, and the node runs it on the same boot
    (no second pull, no second disk) with the batch's --input/--output and date; with no third request within
    the hold it stands down."""
    batch_in = f"s3://{BUCKET}/batch-api/files/file-1.jsonl"
    batch_out = f"s3://{BUCKET}/batch-api/batches/batch_2/output"
    request = {"date": "2026-11-29", "batch_id": "batch_2", "input_uri": batch_in, "output_uri": batch_out}
    (tmp_path / "next-run.json").write_text(json.dumps(request))
    disks = f"/dev/nvme0n1 Amazon Elastic Block Store\\n/dev/nvme1n1 {STORE}\\n/dev/nvme2n1 {STORE}\\n"
    hold = {"next_run_hold_s": 1, "next_run_poll_s": 1}
    result = _boot(tmp_path, aws_cli, account, True, hold, NEXT_RUN=str(tmp_path / "next-run.json"), DISKS=disks)
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    models = str(tmp_path / "models")
    raid = "/dev/md/llm-batch-models"
    assert f"mdadm --create {raid} --run --level=0 --raid-devices=2 /dev/nvme1n1 /dev/nvme2n1" in calls
    assert f"mkfs.xfs -f -q {raid}" in calls and f"mount -o noatime {raid} {models}" in calls
    runs = [i for i, call in enumerate(calls) if call.startswith("docker run")]
    assert len(runs) == 2 and calls.index(f"mount -o noatime {raid} {models}") < runs[0]
    first, second = (calls[i] for i in runs)
    assert "--input" not in first and "awslogs-stream=2026-11-28/" in first  # the night first
    assert second.endswith(f"--input {batch_in} --output {batch_out} --no-image-prefix")
    assert "awslogs-stream=2026-11-29/" in second  # the next run's date: its job settings and log stream
    assert sum(call.startswith(("docker pull", "mkfs.xfs", "mdadm")) for call in calls) == 3  # once each
    assert "docker rm llm-batch-job" in calls
    assert "no new run request within 1 s" in result.stdout
    assert _desired_capacity() == 0 and _no_failure_marker()


def test_one_disk_is_formatted_without_raid_and_none_leaves_the_root_volume(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    one = _boot(tmp_path, aws_cli, account, disks=True, DISKS=f"/dev/nvme1n1 {STORE}\\n")
    assert one.returncode == 0, one.stderr
    calls = _calls(tmp_path)
    assert not any(call.startswith("mdadm") for call in calls)
    assert "mkfs.xfs -f -q /dev/nvme1n1" in calls
    (tmp_path / "calls.log").unlink()
    shutil.rmtree(tmp_path / "bin")
    none = _boot(tmp_path, aws_cli, account, disks=True, DISKS="/dev/nvme0n1 Amazon Elastic Block Store\\n")
    assert none.returncode == 0, none.stderr
    assert not any(call.startswith(("mkfs", "mount ", "mdadm")) for call in _calls(tmp_path))
    assert "model cache stays on the root volume" in none.stdout


def test_the_instance_store_the_ami_mounted_is_used_as_it_is(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    result = _boot(tmp_path, aws_cli, account, disks=True, DLAMI_MOUNTED="0", DISKS=f"/dev/nvme1n1 {STORE}\\n")
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    assert f"mount --bind /opt/dlami/nvme/llm-batch-models {tmp_path / 'models'}" in calls
    assert not any(call.startswith(("mkfs", "mdadm")) for call in calls)


def test_a_disk_that_will_not_format_fails_the_night_by_its_stage(
    tmp_path: Path, aws_cli: str, account: dict[str, str]
) -> None:
    result = _boot(tmp_path, aws_cli, account, disks=True, DISKS=f"/dev/nvme1n1 {STORE}\\n", MKFS_EXIT="1")
    assert result.returncode == 1
    marker, _ = _marker()
    assert marker["stage"] == "preparing the model disk"
    assert _desired_capacity() == 0


def test_the_nodes_hold_is_two_polls_of_the_machine_and_a_margin() -> None:
    """Derived from the machine's own poll interval (the deadline's), never a literal: the next run request
    comes one poll after the summary is seen, at worst two."""
    from infra.statemachines import timing

    for minutes in (1, 240, 24 * 60):
        hold = timing.next_run_hold_s(minutes)
        assert hold >= 2 * timing.poll_seconds(minutes) + timing.NEXT_RUN_MARGIN_S
    with pytest.raises(ValueError, match="next_run_hold_s needs run_request_uri"):
        BootSettings(
            region="us-east-1",
            image="r/i:t",
            job_settings_secret_arn="a",
            hub_token_secret_arn="b",
            log_group="g",
            group_name=GROUP,
            output_prefix_uri=f"s3://{BUCKET}/output/{{date}}/",
            next_run_hold_s=60,
        )
