"""Facts about AWS that age (issue 33): the dated tables, the support window's warnings and price, the pinned
AMI release, the autoscaler's image per minor, and the alert address a real `pulumi up` refuses.

Every date is passed in: a test here never turns red because the calendar moved.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import date, timedelta
from typing import Any

import pulumi
import pytest

from infra import deploy_route, facts, versions
from infra.config import StackConfigError, load_stack_config
from infra.facts import instance_regions
from infra.ops.stacks import ROOT, stack_estimate
from infra.rules.checks_costs import check_eks_support
from tools import eks_ami_releases


def test_the_tables_carry_their_source_and_date() -> None:
    calendar, releases = facts.calendar(), facts.ami_releases()
    assert "version calendar" in calendar.source and calendar.checked == date(2026, 12, 6)
    assert calendar.versions["1.33"].standard_support_end == date(2026, 7, 29)
    assert calendar.versions["1.34"].standard_support_end == date(2026, 12, 2)
    assert calendar.versions["1.35"].standard_support_end == date(2027, 3, 27)
    # Issue 65, finding 3: 1.36 (on EKS since 2026-06-02), with where its dates were read and that it was a copy.
    assert calendar.versions["1.36"] == facts.EksVersion(
        standard_support_end=date(2027, 8, 2), extended_support_end=date(2028, 8, 2)
    )
    assert "1.36 (released on EKS 2026-06-02)" in calendar.source and "secondary copies" in calendar.source
    assert "awslabs/amazon-eks-ami CHANGELOG.md at commit 81fec2e" in releases.source
    assert releases.source_as_of <= releases.checked
    # The facts: v20251108 then v20251112 in November 2025, no v20251110 nor v20251117.
    assert {"v20251108", "v20251112"} <= set(releases.releases)
    assert not {"v20251110", "v20251117"} & set(releases.releases)


def test_the_release_list_is_what_the_tool_reads_from_a_changelog() -> None:
    changelog = (
        "# Changelog\n\n# AMI Release v20260714\n| amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714 |\n"
        "amazon-eks-node-al2023-x86_64-nvidia-1.36-v20260714 amazon-eks-node-al2023-x86_64-standard-1.29-v20260714\n"
        "# AMI Release v20251112\namazon-eks-node-al2023-x86_64-nvidia-1.34-v20251112\n"
        "# AMI Release v20240101\namazon-eks-node-1.28-v20240101\n"
    )
    assert eks_ami_releases.parse(changelog) == {"v20260714": ["1.35", "1.36"], "v20251112": ["1.34"]}
    table = facts.ami_releases().releases
    assert table["v20260714"].kubernetes[-2:] == ["1.35", "1.36"]
    assert "1.35" not in table["v20251112"].kubernetes


def test_the_pinned_alias_is_a_release_with_the_clusters_version() -> None:
    assert versions.EKS_AMI_ALIAS == "al2023@v20260714" and versions.KUBERNETES_VERSION == "1.36"
    assert facts.alias_problem(versions.EKS_AMI_ALIAS, versions.KUBERNETES_VERSION) is None
    problem = facts.alias_problem("al2023@v20251110", "1.35")
    assert problem is not None and "no release v20251110" in problem
    problem = facts.alias_problem("al2023@v20251112", "1.35")
    assert problem is not None and "ships no AL2023 NVIDIA AMI for Kubernetes 1.35" in problem
    with pytest.raises(StackConfigError, match=r"llm-batch:eks: .*ami_alias al2023@v20251112: release v20251112"):
        load_stack_config("large", {"cost_center": "cc", "eks": {"ami_alias": "al2023@v20251112"}})
    with pytest.raises(StackConfigError, match=r"llm-batch:eks\.version: .*1\.31 is not in infra/facts"):
        load_stack_config("medium", {"cost_center": "cc", "eks": {"version": "1.31"}})


def test_the_autoscaler_image_follows_the_version() -> None:
    assert versions.CLUSTER_AUTOSCALER_IMAGE_TAG == "v1.36.1"
    for minor, tag in versions.CLUSTER_AUTOSCALER_IMAGE_TAGS.items():
        assert tag.startswith(f"v{minor}.")
        assert minor in facts.calendar().versions  # every minor a stack may run on the way up
    config = load_stack_config("medium", {"cost_center": "cc", "eks": {"version": 1.34}})  # YAML's float too
    assert versions.CLUSTER_AUTOSCALER_IMAGE_TAGS[config.eks.version] == "v1.34.5"
    with pytest.raises(StackConfigError, match="no cluster autoscaler image"):
        load_stack_config("medium", {"cost_center": "cc", "eks": {"version": "1.32"}})


def test_1_36_can_be_chosen_on_both_eks_tiers_and_karpenter_s_range_is_enforced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 65, finding 3: `--set eks.version=1.36` was refused ("not in infra/facts/eks_versions.json"). It loads
    on medium (its autoscaler image) and large (Karpenter 1.14.1 runs 1.26-1.36; v20260714 ships its AMI); a
    Karpenter whose range stopped at 1.35 would refuse it, naming the key and the range."""
    for stack in ("medium", "large"):
        config = load_stack_config(stack, {"cost_center": "cc", "eks": {"version": "1.36"}})
        assert config.eks.version == "1.36"
    assert versions.KARPENTER_KUBERNETES_RANGE == ("1.26", "1.36")
    monkeypatch.setattr(versions, "KARPENTER_KUBERNETES_RANGE", ("1.26", "1.35"))
    with pytest.raises(StackConfigError, match=r"llm-batch:eks: .*version 1\.36 is outside what Karpenter 1\.14\.1"):
        load_stack_config("large", {"cost_center": "cc", "eks": {"version": "1.36"}})
    load_stack_config("medium", {"cost_center": "cc", "eks": {"version": "1.36"}})  # no Karpenter on medium


@pytest.mark.parametrize(
    ("on", "expected"),
    [
        (date(2026, 12, 1), None),  # 116 days left
        (date(2027, 1, 26), None),  # exactly 60
        (date(2027, 1, 27), "leaves EKS standard support on 2027-03-27 (in 59 days)"),
        (date(2027, 3, 27), "left EKS standard support on 2027-03-27: a cluster on it is billed extended support"),
        (date(2028, 3, 27), "left EKS extended support on 2028-03-27: AWS upgrades such clusters itself"),
    ],
)
def test_the_support_warning_fires_for_a_given_date(on: date, expected: str | None) -> None:
    warning = facts.support_warning("1.35", on)
    if expected is None:
        assert warning is None
    else:
        assert warning is not None and expected in warning and "docs/deploy-eks.md" in warning


def test_stale_tables_warn_after_120_days() -> None:
    checked = facts.calendar().checked
    calendar = "infra/facts/eks_versions.json"
    assert not [line for line in facts.stale_warnings(checked + timedelta(days=120)) if calendar in line]
    (line,) = [line for line in facts.stale_warnings(checked + timedelta(days=121)) if calendar in line]
    assert "was checked against its source on" in line and "121 days ago" in line and "refresh it" in line


def test_the_ami_table_is_judged_by_its_sources_date_not_the_day_it_was_read() -> None:
    """Issue 65, finding 4: read on 2026-12-01 from the 2026-07-23 changelog, the table holds July's releases;
    it is stale 120 days after July 23rd, not after the day it was read."""
    table = facts.ami_releases()
    assert table.source_as_of < table.checked
    ami = "infra/facts/eks_ami_releases.json"
    assert not [line for line in facts.stale_warnings(table.source_as_of + timedelta(days=120)) if ami in line]
    (line,) = [line for line in facts.stale_warnings(table.source_as_of + timedelta(days=121)) if ami in line]
    assert f"from its source as of {table.source_as_of}, 121 days ago" in line
    assert table.source_as_of + timedelta(days=121) < table.checked + timedelta(days=facts.MAX_AGE_DAYS)


def test_the_instance_regions_table_is_judged_by_its_sources_date() -> None:
    """Issue 64: the regions that offer the p5 were read on 2026-12-06 from a source of 2026-07-20; like the AMI
    table it is stale 120 days after its source's date, so the plan and preflight already warn of it."""
    table = instance_regions.instance_regions()
    assert table.source_as_of < table.checked
    name = "infra/facts/instance_regions.json"
    assert not [line for line in facts.stale_warnings(table.source_as_of + timedelta(days=120)) if name in line]
    (line,) = [line for line in facts.stale_warnings(table.source_as_of + timedelta(days=121)) if name in line]
    assert f"from its source as of {table.source_as_of}, 121 days ago" in line and "describe-instance-type" in line
    assert [line for line in facts.stale_warnings(table.checked) if name in line]


def _eks_lines(estimate: Any) -> dict[str, float]:
    return {item.item: round(item.monthly_usd, 2) for item in estimate.items if item.item.startswith("EKS")}


def test_the_estimate_prices_extended_support_while_the_version_is_in_it() -> None:
    """1.33 on 2026-12-01 (extended since 2026-07-29): $0.50 an hour more, 730 hours; the pin (1.36) none."""
    on = date(2026, 12, 1)
    assert _eks_lines(stack_estimate("medium", on=on)) == {"EKS control plane": 73.0}
    old = stack_estimate("medium", overrides={"eks.version": "1.33"}, on=on)
    assert _eks_lines(old) == {"EKS control plane": 73.0, "EKS extended support (Kubernetes 1.33)": 365.0}
    # 1.34 leaves standard support on 2026-12-02: 24 of the month's 730 hours are still standard.
    edge = stack_estimate("medium", overrides={"eks.version": "1.34"}, on=on)
    assert _eks_lines(edge)["EKS extended support (Kubernetes 1.34)"] == round(706 * 0.5, 2)
    assert _eks_lines(stack_estimate("small", on=on)) == {}


def test_the_plan_warns_of_the_window_and_a_real_up_refuses_a_placeholder_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The program's warnings reach the plan's stderr; the e-mail guard stops a real up with one line."""
    result = subprocess.run(
        [sys.executable, "-m", "infra.plan", "medium", "--json", "--no-checks", '--set=eks.version="1.34"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # Whatever today is, 1.34 is under 60 days from the end of standard support or past it (2026-12-02).
    (window,) = [line for line in result.stderr.splitlines() if line.startswith("Kubernetes 1.34 le")]
    assert "standard support on 2026-12-02" in window or "extended support on 2027-12-02" in window
    (email,) = [line for line in result.stderr.splitlines() if "llm-batch:alert_email" in line]
    assert email.startswith("llm-batch:alert_email is ml-oncall@example.com, a placeholder no mail reaches")

    config = load_stack_config("small", {"cost_center": "cc", "alert_email": "oncall@example.com"})
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", warned.append)
    with pytest.raises(
        pulumi.RunError, match=r"^llm-batch:alert_email is oncall@example\.com, a placeholder"
    ) as raised:
        deploy_route.require_alert_email(config, offline=False, dry_run=False)
    assert "\n" not in str(raised.value)
    deploy_route.require_alert_email(config, offline=True, dry_run=False)
    deploy_route.require_alert_email(config, offline=False, dry_run=True)
    assert len(warned) == 2
    for address in ("ml-oncall@corp.example", "a@b.test", "ops@example.org"):
        placeholder = load_stack_config("small", {"cost_center": "cc", "alert_email": address})
        assert deploy_route.alert_email_problem(placeholder) is not None
    for address in ("ml-oncall@acme.com", None):
        real = load_stack_config("small", {"cost_center": "cc", "alert_email": address})
        assert deploy_route.alert_email_problem(real) is None


def test_committed_stacks_pin_the_policy_and_version(plan_for: Any) -> None:
    for stack in ("medium", "large"):
        (cluster,) = [item for item in plan_for(stack) if item["type"] == "eks:index:Cluster"]
        assert cluster["inputs"]["upgradePolicy"] == {"supportType": "STANDARD"}
        assert cluster["inputs"]["version"] == "1.36"
        groups = [item for item in plan_for(stack) if item["type"] == "eks:index:ManagedNodeGroup"]
        assert groups and {group["inputs"]["version"] for group in groups} == {"1.36"}
    (chart,) = [
        item
        for item in plan_for("medium")
        if item["type"] == "kubernetes:helm.sh/v4:Chart" and "cluster-autoscaler" in item["name"]
    ]
    assert chart["inputs"]["values"]["image"]["tag"] == "v1.36.1" and chart["inputs"]["version"] == "9.59.0"
    assert (
        json.dumps(versions.HELM_CHARTS["cluster-autoscaler"])
        == '["https://kubernetes.github.io/autoscaler", "9.59.0"]'
    )


def test_eks_support_check_fails_without_the_policy_or_on_a_lagging_group(plan_for: Any) -> None:
    plan = copy.deepcopy(plan_for("medium"))
    assert check_eks_support(plan) == []
    (cluster,) = [item for item in plan if item["type"] == "eks:index:Cluster"]
    del cluster["inputs"]["upgradePolicy"]
    head = next(item for item in plan if item["type"] == "eks:index:ManagedNodeGroup")
    head["inputs"]["version"] = "1.33"
    problems = "\n".join(str(violation) for violation in check_eks_support(plan))
    assert "no upgradePolicy.supportType: EKS would pick EXTENDED" in problems
    assert f"{head['name']}: version 1.33, not the cluster's ['1.36']" in problems
