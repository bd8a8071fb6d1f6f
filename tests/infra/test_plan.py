"""The offline plan: the program runs under mocks for every stack and reports what it would create."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.ops import plan as plan_module
from infra.ops import stacks as stacks_module
from infra.ops.plan import PlanError, capture_plan, render_tree, run_program, summary
from infra.ops.plan_mocks import PlanMocks
from infra.ops.policy import main as policy_main
from infra.ops.stacks import ROOT
from infra.rules.registry import preview_line
from tests.infra.conftest import STACKS

SHARED_COMPONENTS = {
    "llmbatch:providers:Providers",
    "llmbatch:kms:EncryptionKey",
    "llmbatch:storage:DataBucket",
    "llmbatch:alerts:Alerts",
}


def test_every_tier_has_a_stack_file() -> None:
    assert set(STACKS) >= {"small", "medium", "large"}


@pytest.mark.parametrize("stack", STACKS)
def test_plan_lists_the_shared_components(plan_for, stack: str) -> None:
    plan = plan_for(stack)
    types = {item["type"] for item in plan}
    assert types >= SHARED_COMPONENTS
    for item in plan:
        assert {"type", "name", "parent", "inputs"} <= set(item)
    # Every AWS resource is a child of one of the program's components, not loose in the stack.
    components = {item["urn"] for item in plan if not item["custom"]}
    loose = [item["name"] for item in plan if item["custom"] and item["parent"] not in components]
    assert loose == []


def test_unknown_stack_names_the_known_ones() -> None:
    with pytest.raises(PlanError, match=r"no stack file stacks/Pulumi\.nope\.yaml; stacks: .*small"):
        capture_plan("nope")


def test_cli_prints_a_tree_and_json(plan_for) -> None:
    tree = subprocess.run(
        [sys.executable, "-m", "infra.plan", "small"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    # The tree, then the cost estimate (tests/infra/test_stack_costs.py checks that part).
    plan = plan_for("small")
    deferred = preview_line(plan)
    assert deferred is not None
    assert tree.startswith(
        f"{render_tree(plan, details=False)}\n{summary(plan)}\n{deferred}\n\nMonthly cost estimate for stack small"
    )
    assert "aws:s3/bucket:Bucket  storage-bucket" in tree
    listed = json.loads(
        subprocess.run(
            [sys.executable, "-m", "infra.plan", "small", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert listed == plan_for("small")


def test_tree_shows_kubernetes_manifests_in_full() -> None:
    stack_urn = "urn:pulumi:s::llm-batch::pulumi:pulumi:Stack::llm-batch-s"
    component = {
        "urn": "urn:c",
        "type": "llmbatch:eks:Workload",
        "name": "w",
        "parent": stack_urn,
        "custom": False,
    }
    manifest = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "nightly", "namespace": "llm-batch"},
        "spec": {"entrypoint": "python -m workload run --config /etc/llm-batch/job.yaml"},
    }
    job = {
        "urn": "urn:j",
        "type": "kubernetes:ray.io/v1:RayJob",
        "name": "nightly",
        "parent": "urn:c",
        "custom": True,
        "inputs": manifest,
    }
    tree = render_tree([component, job])
    assert "* llmbatch:eks:Workload  w\n  + kubernetes:ray.io/v1:RayJob  nightly\n      apiVersion: ray.io/v1" in tree
    assert "        entrypoint: python -m workload run --config /etc/llm-batch/job.yaml" in tree
    # Without --details the tree keeps one line per object.
    assert render_tree([component, job], details=False).splitlines()[:2] == [
        "* llmbatch:eks:Workload  w",
        "  + kubernetes:ray.io/v1:RayJob  nightly",
    ]


def test_summary_counts_resources_by_component_and_service(plan_for) -> None:
    plan = plan_for("small")
    line = summary(plan)
    resources = sum(1 for item in plan if item["custom"])
    assert line.startswith(f"{resources} resources in ")
    by_component = line.split("By component: ")[1].split(". By service: ")[0]
    counted = {name: int(n) for name, n in (part.rsplit(" ", 1) for part in by_component.split(", "))}
    assert sum(counted.values()) == resources and counted["storage"] >= 7 and "gpu-node" in counted
    assert "aws:s3 " in line.split("By service: ")[1]


def test_a_missing_price_warns_and_the_plan_still_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.ops import plan as plan_tool

    (tmp_path / "Pulumi.eu.yaml").write_text(
        "config:\n  llm-batch:tier: small\n  llm-batch:cost_center: cc\n  llm-batch:region: eu-west-1\n"
    )
    monkeypatch.setattr(stacks_module, "STACKS_DIR", tmp_path)
    assert plan_tool.main(["eu"]) == 0
    captured = capsys.readouterr()
    assert "+ aws:s3/bucket:Bucket  storage-bucket" in captured.out and "resources in" in captured.out
    assert "warning: no cost estimate: region 'eu-west-1' is not in the price table" in captured.out
    assert "python -m infra.pricing.refresh --region eu-west-1" in captured.err


def test_program_with_secret_token_and_existing_vpc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole program in this process, from a stack file with an encrypted value and an existing VPC."""
    (tmp_path / "Pulumi.edge.yaml").write_text(
        yaml.safe_dump(
            {
                "config": {
                    "llm-batch:tier": "small",
                    "llm-batch:cost_center": "cc-9",
                    "llm-batch:region": "eu-west-1",
                    "llm-batch:hub_token": {"secure": "AAABAJ0x...encrypted"},
                    "llm-batch:network": {
                        "existing_vpc_id": "vpc-0abc",
                        "existing_private_subnet_ids": ["subnet-01", "subnet-02"],
                    },
                    "llm-batch:small": {"instance_type": "g6.xlarge", "root_volume_gib": 300},
                }
            }
        )
    )
    monkeypatch.setattr(stacks_module, "STACKS_DIR", tmp_path)
    plan = run_program("edge")
    types = [item["type"] for item in plan]
    assert "aws:ec2/vpc:Vpc" not in types and "aws:ec2/natGateway:NatGateway" not in types
    versions = [item for item in plan if item["type"] == "aws:secretsmanager/secretVersion:SecretVersion"]
    assert {item["name"] for item in versions} == {"secrets-job-settings", "secrets-hub-token"}
    assert all(item["inputs"]["secretString"] == "[secret]" for item in versions)
    template = next(item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]
    assert template["instanceType"] == "g6.xlarge"
    assert template["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 300
    group = next(item for item in plan if item["type"] == "aws:autoscaling/group:Group")["inputs"]
    assert group["vpcZoneIdentifiers"] == ["subnet-01", "subnet-02"]
    provider = next(item for item in plan if item["name"] == "providers-aws")["inputs"]
    assert provider["region"] == "eu-west-1"
    assert json.loads(provider["defaultTags"])["tags"]["CostCenter"] == "cc-9"
    bucket = next(item for item in plan if item["type"] == "aws:s3/bucket:Bucket")["inputs"]
    assert bucket["bucket"] == "llm-batch-edge-data-123456789012-eu-west-1"


def test_bad_stack_config_stops_the_plan_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Pulumi's mocks as under `pulumi up`: pulumi.RunError, which Pulumi prints as one clean line."""
    (tmp_path / "Pulumi.bad.yaml").write_text(
        "config:\n  llm-batch:tier: small\n  llm-batch:network:\n    az_count: 1\n"
    )
    monkeypatch.setattr(stacks_module, "STACKS_DIR", tmp_path)
    with pytest.raises(pulumi.RunError) as caught:
        run_program("bad")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("invalid stack config: llm-batch:cost_center: Field required; ")
    assert "llm-batch:network.az_count: Input should be greater than or equal to 2" in message


def test_config_comes_through_pulumi_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key set only in the stack file reaches the model; an unknown key is refused, not dropped."""
    (tmp_path / "Pulumi.typo.yaml").write_text(
        "config:\n  llm-batch:tier: small\n  llm-batch:cost_center: cc\n  llm-batch:alert_emial: x@example.com\n"
    )
    monkeypatch.setattr(stacks_module, "STACKS_DIR", tmp_path)
    with pytest.raises(pulumi.RunError, match=r"llm-batch:alert_emial: Extra inputs are not permitted"):
        run_program("typo")


def test_every_lookup_goes_through_the_stack_provider() -> None:
    """Data sources (caller identity, zones, the AMI) use the tagged, regional provider, not a default."""
    mocks = PlanMocks(region="us-east-1")
    plan = run_program("small", mocks=mocks)
    provider = next(item for item in plan if item["name"] == "providers-aws")
    tokens = {token for token, _ in mocks.calls}
    assert {
        "aws:index/getCallerIdentity:getCallerIdentity",
        "aws:index/getAvailabilityZones:getAvailabilityZones",
        "aws:ssm/getParameter:getParameter",
    } <= tokens
    assert all(reference.startswith(provider["urn"] + "::") for _, reference in mocks.calls), mocks.calls


def test_policy_cli_reports_each_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_main(["small"]) == 0
    out = capsys.readouterr().out
    # Named, not counted from CHECKS: a check that silently drops out of the CLI must fail here.
    ok = (
        "cost-tags",
        "buckets",
        "iam",
        "launch-templates",
        "security-groups",
        "images",
        "volume-keys",
        "alert-keys",
        "cost-scope",
        "cost-tag-activation",
        "passrole",
        "kms-admin",
        "kms-via-service",
        "trust",
        "resource-principals",
        "service-principals",
        "key-logs-scope",
        "lambda-permissions",
        "bucket-types",
        "store-keys",
        "iam-users",
        "secret-values",
        "sg-egress",
        "egress-path",
        "endpoint-policies",  # the S3 gateway endpoint every tier has
        "api-routes",
        "public-endpoints",
        "cross-account",
    )
    cluster_only = (
        "eks-access-order",
        "k8s-order",
        "eks-endpoint",
        "node-metadata",
        "k8s-exposure",
        "pod-security",
        "worker-identity",
        "ray-network-policy",
        "eks-support",
        "ray-isolation",
    )
    *verdicts, deferred = out.splitlines()
    lines = [line.split()[:2] for line in verdicts]
    assert sorted(lines) == sorted([["ok", check] for check in ok] + [["n/a", check] for check in cluster_only])
    # Last, the rules whose verdict rests on mock ids/ARNs: the policy pack judges them for real on `pulumi up`.
    head, _, names = deferred.partition(": ")
    assert head == "judged here on mock ids/ARNs, for real only by the policy pack on `pulumi up`"
    assert {"buckets", "store-keys", "egress-path"} <= set(names.split(", ")) <= set(ok)


def test_policy_cli_checks_a_saved_plan(
    plan_for: Callable[[str], list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = copy.deepcopy(plan_for("large"))
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan))
    assert policy_main(["--plan", str(saved)]) == 0
    cluster = next(item for item in plan if item["type"] == "eks:index:Cluster")
    cluster["inputs"]["endpointPublicAccess"] = True
    saved.write_text(json.dumps(plan))
    assert policy_main(["--plan", str(saved)]) == 1
    out = capsys.readouterr().out
    assert "FAIL eks-endpoint" in out
    assert "eks:index:Cluster eks-cluster: public endpoint with no CIDR list" in out
    assert "fix: keep the endpoint private" in out
    saved.write_text("{}")
    assert policy_main(["--plan", str(saved)]) == 2


def test_plan_command_gate_fails_on_a_violation(
    plan_for: Callable[[str], list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    # `python -m infra.plan` runs this gate over every plan it shows (make plan too); the program itself
    # cannot be broken from a test, so its plan is.
    plan = copy.deepcopy(plan_for("small"))
    assert plan_module._gate(plan) == 0
    template = next(item for item in plan if item["type"] == "aws:ec2/launchTemplate:LaunchTemplate")
    template["inputs"]["metadataOptions"]["httpTokens"] = "optional"
    assert plan_module._gate(plan) == 1
    err = capsys.readouterr().err
    assert "[launch-templates] aws:ec2/launchTemplate:LaunchTemplate gpu-node-template: IMDSv2 not required" in err
    assert "fix: httpTokens required" in err
