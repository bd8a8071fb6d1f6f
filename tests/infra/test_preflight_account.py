"""Preflight's account checks (issue 33): the EC2 Spot service-linked role, the AMI alias's SSM parameter, the
zones that offer the tier's types, the deployed cluster's Kubernetes version (issue 65, finding 3), and the dated
facts' warnings.

AWS's answers are replayed through botocore's Stubber, which checks every request against the real API model
(IAM GetRole, SSM GetParameter, EC2 DescribeAvailabilityZones and DescribeInstanceTypeOfferings, EKS
DescribeCluster): the role, the public AMI parameters and a cluster AWS upgraded by itself are the account's and
AWS's, which no local server holds as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import date
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from infra import facts, versions
from infra.ops import preflight_account
from infra.ops.preflight import run
from infra.ops.stacks import offline_config

SPOT_ROLE_ARN = "arn:aws:iam::123456789012:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"


def _client(service: str, region: str = "us-west-2") -> Any:
    return boto3.client(service, region_name=region, aws_access_key_id="x", aws_secret_access_key="x")


def _role() -> dict[str, Any]:
    return {
        "Role": {
            "Path": "/aws-service-role/spot.amazonaws.com/",
            "RoleName": "AWSServiceRoleForEC2Spot",
            "RoleId": "AROAEXAMPLEEXAMPLE123",
            "Arn": SPOT_ROLE_ARN,
            "CreateDate": "2024-01-01T00:00:00Z",
        }
    }


def _zones(region: str, letters: str) -> dict[str, Any]:
    return {
        "AvailabilityZones": [
            {"ZoneName": f"{region}{letter}", "State": "available", "RegionName": region} for letter in letters
        ]
    }


def _offerings(region: str, offered: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "InstanceTypeOfferings": [
            {"InstanceType": instance_type, "LocationType": "availability-zone", "Location": f"{region}{letter}"}
            for letter, types in offered.items()
            for instance_type in types
        ]
    }


def _expect_zones(stub: Stubber, region: str, letters: str, offered: dict[str, list[str]], types: list[str]) -> None:
    stub.add_response(
        "describe_availability_zones",
        _zones(region, letters),
        {
            "Filters": [
                {"Name": "opt-in-status", "Values": ["opt-in-not-required"]},
                {"Name": "state", "Values": ["available"]},
            ]
        },
    )
    stub.add_response(
        "describe_instance_type_offerings",
        _offerings(region, offered),
        {"LocationType": "availability-zone", "Filters": [{"Name": "instance-type", "Values": sorted(types)}]},
    )


def test_a_missing_spot_role_prints_the_one_command_that_creates_it() -> None:
    iam = _client("iam")
    with Stubber(iam) as stub:
        stub.add_client_error(
            "get_role", "NoSuchEntity", http_status_code=404, expected_params={"RoleName": "AWSServiceRoleForEC2Spot"}
        )
        missing = preflight_account.check_spot_role(iam)
        stub.add_response("get_role", _role(), {"RoleName": "AWSServiceRoleForEC2Spot"})
        present = preflight_account.check_spot_role(iam)
    assert not missing.ok
    assert "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com" in missing.text
    assert "ServiceLinkedRoleCreationNotPermitted" in missing.text
    assert present.ok and SPOT_ROLE_ARN in present.text


def test_the_pinned_alias_resolves_through_its_ssm_parameter() -> None:
    """The parameter is the one Karpenter reads for the alias (karpenter-provider-aws amifamily/al2023.go)."""
    name = facts.alias_ssm_parameter(versions.EKS_AMI_ALIAS, versions.KUBERNETES_VERSION)
    assert name == (
        "/aws/service/eks/optimized-ami/1.36/amazon-linux-2023/x86_64/nvidia/"
        "amazon-eks-node-al2023-x86_64-nvidia-1.36-v20260714/image_id"
    )
    ssm = _client("ssm")
    answer = {"Parameter": {"Name": name, "Type": "String", "Value": "ami-0abcdef1234567890", "Version": 1}}
    with Stubber(ssm) as stub:
        stub.add_response("get_parameter", answer, {"Name": name})
        found = preflight_account.check_ami_alias(ssm, versions.EKS_AMI_ALIAS, versions.KUBERNETES_VERSION)
        # The pin: no such release, so no such parameter.
        wrong = facts.alias_ssm_parameter("al2023@v20251110", "1.35")
        stub.add_client_error(
            "get_parameter", "ParameterNotFound", http_status_code=400, expected_params={"Name": wrong}
        )
        missing = preflight_account.check_ami_alias(ssm, "al2023@v20251110", "1.35")
    assert found.ok and "ami-0abcdef1234567890" in found.text
    assert not missing.ok and wrong in missing.text and "never be ready" in missing.text


def test_zones_are_those_offering_the_tiers_types() -> None:
    """us-west-2a lacks g5.2xlarge (preferred) and us-west-2d g5.xlarge (required): the three zones are b, c and a."""
    config = offline_config("large")
    required, preferred = config.zone_instance_types
    # The system node (t3.medium) runs all month in one of these zones, so it is required like the others.
    assert required == ["g5.xlarge", "m5.xlarge", "t3.medium"] and preferred == ["g5.2xlarge"]
    everything = [*required, *preferred]
    offered = {
        "a": [t for t in everything if t != "g5.2xlarge"],
        "b": everything,
        "c": everything,
        "d": [t for t in everything if t != "g5.xlarge"],
    }
    ec2 = _client("ec2")
    with Stubber(ec2) as stub:
        _expect_zones(stub, "us-west-2", "abcd", offered, everything)
        finding = preflight_account.check_zones(ec2, config)
    assert finding.ok, finding.text
    assert finding.text.startswith("subnets go in us-west-2a, us-west-2b, us-west-2c, where")


def test_too_few_zones_with_the_gpu_type_fail_naming_the_key() -> None:
    config = offline_config("small")  # g5.xlarge in two zones
    ec2 = _client("ec2", "us-east-1")
    with Stubber(ec2) as stub:
        _expect_zones(stub, "us-east-1", "abc", {"c": ["g5.xlarge"]}, ["g5.xlarge"])
        finding = preflight_account.check_zones(ec2, config)
    assert not finding.ok
    assert "network.az_count is 2 but only 1 of the zones" in finding.text and "g5.xlarge (us-east-1c)" in finding.text


def _cluster(version: str, support_type: str = "STANDARD", name: str = "llm-batch-large") -> dict[str, Any]:
    return {"cluster": {"name": name, "version": version, "upgradePolicy": {"supportType": support_type}}}


@contextmanager
def _account(region: str, spot_role: bool, cluster: str | None = None) -> Iterator[Callable[[str], Any]]:
    """Stubbed IAM, SSM, EC2 and EKS clients answering the large stack's account checks in order; the cluster
    runs `cluster` (default: the pinned version)."""
    made = {service: _client(service, region) for service in ("iam", "ssm", "ec2", "eks")}
    with ExitStack() as stack:
        stubs = {service: stack.enter_context(Stubber(client)) for service, client in made.items()}
        if spot_role:
            stubs["iam"].add_response("get_role", _role(), {"RoleName": "AWSServiceRoleForEC2Spot"})
        else:
            stubs["iam"].add_client_error("get_role", "NoSuchEntity", http_status_code=404)
        name = facts.alias_ssm_parameter(versions.EKS_AMI_ALIAS, versions.KUBERNETES_VERSION)
        parameter = {"Parameter": {"Name": name, "Type": "String", "Value": "ami-0123456789abcdef0", "Version": 3}}
        stubs["ssm"].add_response("get_parameter", parameter, {"Name": name})
        types = ["g5.2xlarge", "g5.xlarge", "m5.xlarge", "t3.medium"]
        _expect_zones(stubs["ec2"], region, "abcd", {letter: types for letter in "abcd"}, types)
        answer = _cluster(cluster or versions.KUBERNETES_VERSION)
        stubs["eks"].add_response("describe_cluster", answer, {"name": "llm-batch-large"})
        yield made.__getitem__
        for stub in stubs.values():
            stub.assert_no_pending_responses()


def _quotas(region: str) -> Any:
    client = _client("service-quotas", region)
    stub = Stubber(client)
    for code, value in (
        ("L-1216C47A", 640),
        ("L-3819A6DF", 64),
        ("L-DB2E81BA", 64),
    ):
        stub.add_response(
            "get_service_quota",
            {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": code, "Value": value}},
            {"ServiceCode": "ec2", "QuotaCode": code},
        )
    stub.activate()
    return client


@pytest.mark.parametrize("spot_role", [True, False])
def test_preflight_large_checks_the_account_and_fails_on_a_missing_role(spot_role: bool) -> None:
    with _account("us-west-2", spot_role) as clients:
        ok, report = run("large", _quotas("us-west-2"), clients, on=date(2026, 12, 1))
    assert ok is spot_role
    assert "ok       ami-alias: al2023@v20260714 on Kubernetes 1.36 resolves to ami-0123456789abcdef0" in report
    assert "ok       zones: subnets go in us-west-2a, us-west-2b, us-west-2c" in report
    assert "ok       cluster-version: llm-batch-large runs Kubernetes 1.36, the stack's eks.version" in report
    assert ("MISSING  spot-role" in report) is not spot_role
    # 2026-12-01: 1.36 has 244 days of standard support left and the calendar is newer; the AMI table, read that
    # day, holds the 2026-07-23 changelog's releases: 131 days old (issue 65, 4); the p5's regions and its two
    # regions' prices come from sources of 2026-07-20: 134 days old (issue 64). Those four warnings, no others.
    warnings = [line.strip() for line in report.splitlines() if line.strip().startswith("warning")]
    assert len(warnings) == 4
    stale = "eks_ami_releases.json was read (on 2026-12-01) from its source as of 2026-07-23, 131 days ago"
    assert stale in warnings[0]
    assert (
        "instance_regions.json was read (on 2026-12-06) from its source as of 2026-07-20, 134 days ago" in warnings[1]
    )
    for region, warning in zip(("us-east-1", "us-west-2"), warnings[2:], strict=True):
        assert f"prices.json p5.48xlarge ({region}) was seen at its source on 2026-07-20, 134 days ago" in warning


def test_preflight_warns_of_the_support_window_and_stale_facts_on_a_later_day() -> None:
    """The same account on 2027-06-23: 40 days of 1.36's standard support left, the calendar 199 days old."""
    with _account("us-west-2", True) as clients:
        ok, report = run("large", _quotas("us-west-2"), clients, on=date(2027, 6, 23))
    assert ok  # warnings do not fail it
    assert "warning  facts: Kubernetes 1.36 leaves EKS standard support on 2027-08-02 (in 40 days)" in report
    assert "eks_versions.json was checked against its source on 2026-12-06, 199 days ago" in report


def test_a_cluster_one_minor_behind_the_pin_is_upgraded_by_the_next_up() -> None:
    """A large stack deployed under the 1.35 pin: the next `up` takes it to 1.36, one minor, as EKS allows."""
    with _account("us-west-2", True, cluster="1.35") as clients:
        ok, report = run("large", _quotas("us-west-2"), clients, on=date(2026, 12, 6))
    assert ok
    (line,) = [line.strip() for line in report.splitlines() if "cluster-version" in line]
    assert line.startswith("warning  cluster-version: llm-batch-large runs Kubernetes 1.35; the next `up` upgrades")
    assert "to eks.version 1.36 (one minor version, as EKS allows)" in line


def _version_finding(actual: str | None, pinned: str) -> preflight_account.Finding:
    eks = _client("eks")
    with Stubber(eks) as stub:
        if actual is None:
            stub.add_client_error("describe_cluster", "ResourceNotFoundException", http_status_code=404)
        else:
            stub.add_response("describe_cluster", _cluster(actual), {"name": "llm-batch-large"})
        return preflight_account.check_cluster_version(eks, "llm-batch-large", pinned)


def test_a_cluster_aws_upgraded_itself_fails_preflight_saying_what_the_next_up_does() -> None:
    """Issue 65, finding 3: a stack left on 1.35 past 2027-03-27 under the STANDARD policy is moved to 1.36 by AWS.
    The control plane is then newer than `eks.version`; preflight says what `up` would do and the one fix."""
    finding = _version_finding("1.36", pinned="1.35")
    assert not finding.ok
    assert finding.text.startswith(
        "llm-batch-large runs Kubernetes 1.36, newer than eks.version 1.35: AWS upgraded the control plane itself "
        "(upgrade policy STANDARD)"
    )
    assert "keeps the node groups, add-ons and cluster autoscaler on 1.35" in finding.text
    assert "would try to take the control plane back down to 1.35" in finding.text
    assert "pulumi config set --path 'llm-batch:eks.version' 1.36" in finding.text
    assert "When AWS upgraded the cluster itself" in finding.text


@pytest.mark.parametrize(
    ("actual", "ok", "text"),
    [
        (None, True, "no cluster llm-batch-large yet: the first `up` creates it on Kubernetes 1.36"),
        ("1.36", True, "llm-batch-large runs Kubernetes 1.36, the stack's eks.version"),
        ("1.34", False, "so the next `up` would fail; set llm-batch:eks.version to 1.35, `up`, and repeat"),
    ],
)
def test_the_cluster_version_check_for_a_new_current_or_far_behind_cluster(
    actual: str | None, ok: bool, text: str
) -> None:
    finding = _version_finding(actual, pinned="1.36")
    assert finding.ok is ok and not finding.warning
    assert text in finding.text


def test_quotas_from_a_file_name_what_they_leave_unchecked() -> None:
    ok, report = run("large", _quotas("us-west-2"))
    assert ok
    assert report.splitlines()[-1] == (
        "Not checked without AWS (--quotas): the EC2 Spot service-linked role (AWSServiceRoleForEC2Spot); the AMI "
        "alias's SSM parameter; the zones offering the tier's instance types; the deployed cluster's Kubernetes "
        "version."
    )
