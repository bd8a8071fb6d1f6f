"""Preflight, beyond quotas: what the account must hold before `pulumi up`, read with the caller's credentials.

- The EC2 Spot service-linked role (Karpenter's tiers): Karpenter launches Spot nodes with CreateFleet, which
  needs `AWSServiceRoleForEC2Spot` in the account; an account that never ran Spot lacks it, and the controller
  may not create it (no iam:CreateServiceLinkedRole), so every Spot launch fails with
  `AuthFailure.ServiceLinkedRoleCreationNotPermitted`. The program does not create it either: the role is the
  account's, it exists in many accounts already (creating it again fails) and a `destroy` would delete it.
- The AMI alias (Karpenter's tiers): the SSM parameter Karpenter resolves the pinned `al2023@<release>` to for
  the cluster's version and the GPU nodes' NVIDIA variant. Missing, the EC2NodeClass never becomes ready.
- The zones: where the tier's instance types are offered (DescribeInstanceTypeOfferings), chosen as the
  program chooses them (infra/zones.py), so the operator sees which zones the subnets will go in.
- The cluster's own Kubernetes version (the EKS tiers), against `eks.version`: under the STANDARD upgrade policy
  AWS moves the control plane up one minor version itself at the end of standard support, and it leaves the
  node groups, add-ons and the cluster autoscaler behind; the finding says what the next `up` then does and the
  one thing to set (docs/deploy-eks.md, "When AWS upgraded the cluster itself").
- The Batch API's functions (where it is on): their reserved concurrency against the account's Lambda quota
  (infra/ops/preflight_lambda.py).
- The dated facts: the version's support window and tables not checked for a while (infra/facts).

Each check returns a `Finding`; a failed one fails the preflight and says the one thing to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from infra import facts
from infra.zones import ZoneError, choose_zones, offered_by_zone

if TYPE_CHECKING:
    from infra.config import StackConfig

SPOT_ROLE = "AWSServiceRoleForEC2Spot"
CREATE_SPOT_ROLE = "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com"


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    text: str
    warning: bool = False  # said, but does not fail the preflight


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def check_spot_role(iam: Any) -> Finding:
    try:
        role = iam.get_role(RoleName=SPOT_ROLE)["Role"]
    except ClientError as error:
        if _code(error) != "NoSuchEntity":
            return Finding("spot-role", False, f"reading IAM role {SPOT_ROLE} failed: {error}")
        return Finding(
            "spot-role",
            False,
            f"the account has no {SPOT_ROLE}: Karpenter's Spot launches would fail with "
            f"AuthFailure.ServiceLinkedRoleCreationNotPermitted; create it once: {CREATE_SPOT_ROLE}",
        )
    except BotoCoreError as error:
        return Finding("spot-role", False, f"reading IAM role {SPOT_ROLE} failed: {error}")
    return Finding("spot-role", True, f"{SPOT_ROLE} exists ({role['Arn']})")


def check_ami_alias(ssm: Any, alias: str, kubernetes: str) -> Finding:
    name = facts.alias_ssm_parameter(alias, kubernetes)
    try:
        image = ssm.get_parameter(Name=name)["Parameter"]["Value"]
    except ClientError as error:
        if _code(error) != "ParameterNotFound":
            return Finding("ami-alias", False, f"reading SSM parameter {name} failed: {error}")
        return Finding(
            "ami-alias",
            False,
            f"{alias} resolves to no AMI for Kubernetes {kubernetes} ({name} does not exist): Karpenter's "
            "EC2NodeClass would never be ready; pin a release from infra/facts/eks_ami_releases.json that ships it",
        )
    except BotoCoreError as error:
        return Finding("ami-alias", False, f"reading SSM parameter {name} failed: {error}")
    return Finding("ami-alias", True, f"{alias} on Kubernetes {kubernetes} resolves to {image} (GPU nodes' AMI)")


def check_cluster_version(eks: Any, cluster_name: str, pinned: str) -> Finding:
    """The deployed cluster's version against the stack's `eks.version`, and what the next `up` does with them."""
    try:
        cluster = eks.describe_cluster(name=cluster_name)["cluster"]
    except ClientError as error:
        if _code(error) != "ResourceNotFoundException":
            return Finding("cluster-version", False, f"reading EKS cluster {cluster_name} failed: {error}")
        return Finding(
            "cluster-version", True, f"no cluster {cluster_name} yet: the first `up` creates it on Kubernetes {pinned}"
        )
    except BotoCoreError as error:
        return Finding("cluster-version", False, f"reading EKS cluster {cluster_name} failed: {error}")
    actual = cluster["version"]
    policy = cluster.get("upgradePolicy", {}).get("supportType", "unknown")
    running = f"{cluster_name} runs Kubernetes {actual}"
    step = facts.minor(pinned) - facts.minor(actual)
    if step == 0:
        return Finding("cluster-version", True, f"{running}, the stack's eks.version")
    if step == 1:
        return Finding(
            "cluster-version",
            True,
            f"{running}; the next `up` upgrades it to eks.version {pinned} (one minor version, as EKS allows): the "
            "control plane, then the node groups roll to new nodes, the add-ons and the cluster autoscaler follow; "
            "run it with no night running",
            warning=True,
        )
    if step > 1:
        following = f"1.{facts.minor(actual) + 1}"
        return Finding(
            "cluster-version",
            False,
            f"{running} and eks.version is {pinned}: EKS upgrades one minor version at a time, so the next `up` "
            f"would fail; set llm-batch:eks.version to {following}, `up`, and repeat one minor at a time up to "
            f"{pinned} (docs/deploy-eks.md)",
        )
    # Newer than the stack says: AWS upgraded the control plane itself (the STANDARD policy at the end of standard
    # support), which touches neither Pulumi's state nor the node groups.
    return Finding(
        "cluster-version",
        False,
        f"{running}, newer than eks.version {pinned}: AWS upgraded the control plane itself (upgrade policy "
        f"{policy}). The next `up` changes nothing on the control plane (Pulumi's state still says {pinned}), "
        f"keeps the node groups, add-ons and cluster autoscaler on {pinned}, and after a refresh would try to take "
        f"the control plane back down to {pinned}. Set llm-batch:eks.version to {actual} (`pulumi config set "
        f"--path 'llm-batch:eks.version' {actual}`) and run `pulumi up --refresh`: the node groups, add-ons and "
        f'autoscaler then follow to {actual} (docs/deploy-eks.md, "When AWS upgraded the cluster itself")',
    )


def _offerings(ec2: Any, types: list[str]) -> Iterator[tuple[str, str]]:
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    pages = paginator.paginate(LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": types}])
    for page in pages:
        for offering in page["InstanceTypeOfferings"]:
            yield offering["InstanceType"], offering["Location"]


def check_zones(ec2: Any, config: StackConfig) -> Finding:
    required, preferred = config.zone_instance_types
    if not config.network.create_vpc:
        return Finding("zones", True, "an existing VPC: its subnets' zones are the stack's (not chosen here)")
    try:
        answer = ec2.describe_availability_zones(
            Filters=[
                {"Name": "opt-in-status", "Values": ["opt-in-not-required"]},
                {"Name": "state", "Values": ["available"]},
            ]
        )
        zones = sorted(zone["ZoneName"] for zone in answer["AvailabilityZones"])
        offered = offered_by_zone(_offerings(ec2, sorted({*required, *preferred})))
    except (ClientError, BotoCoreError) as error:
        return Finding("zones", False, f"reading the zones and their instance types failed: {error}")
    try:
        chosen = choose_zones(zones, offered, required, preferred, config.network.az_count)
    except ZoneError as error:
        return Finding("zones", False, str(error))
    detail = "; ".join(f"{zone}: {', '.join(sorted(offered.get(zone, set())))}" for zone in chosen)
    return Finding("zones", True, f"subnets go in {', '.join(chosen)}, where the tier's types are offered ({detail})")


def account_findings(config: StackConfig, clients: Any, on: date, cluster_name: str) -> list[Finding]:
    """Every account check the stack's tier needs; `clients(service)` gives a boto3 client (or a stand-in);
    `cluster_name` is the stack's EKS cluster (the EKS tiers'). The Batch API's functions are checked beside
    these (infra/ops/preflight_lambda.py)."""
    findings = []
    if config.tier != "small" and config.eks.karpenter_enabled:
        if config.eks.node_pool.spot:
            findings.append(check_spot_role(clients("iam")))
        findings.append(check_ami_alias(clients("ssm"), config.eks.ami_alias, config.eks.version))
    findings.append(check_zones(clients("ec2"), config))
    if config.tier != "small":
        findings.append(check_cluster_version(clients("eks"), cluster_name, config.eks.version))
    version = None if config.tier == "small" else config.eks.version
    findings += [Finding("facts", True, line, warning=True) for line in facts.calendar_warnings(version, on)]
    return findings


def skipped(config: StackConfig) -> str:
    """What `--quotas` (no AWS calls) leaves unchecked."""
    names = ["the zones offering the tier's instance types"]
    if config.tier != "small" and config.eks.karpenter_enabled:
        names = [f"the EC2 Spot service-linked role ({SPOT_ROLE})", "the AMI alias's SSM parameter", *names]
    if config.tier != "small":
        names.append("the deployed cluster's Kubernetes version")
    if config.batch_api.enabled:
        names.append("the Batch API functions' reserved concurrency against the account's Lambda quota")
    return "Not checked without AWS (--quotas): " + "; ".join(names) + "."


def format_findings(findings: list[Finding]) -> str:
    lines = ["Account:"]
    for finding in findings:
        status = "warning" if finding.warning else ("ok" if finding.ok else "MISSING")
        lines.append(f"  {status:<8} {finding.name}: {finding.text}")
    return "\n".join(lines)
