"""Facts about AWS that age, kept in the repo as small tables with their source and the date they were checked.

- `eks_versions.json`: EKS's Kubernetes version calendar (end of standard and of extended support). A cluster on
  a version past standard support is billed extended support; the estimate prices it and the plan and preflight
  warn `MIN_STANDARD_DAYS` before it starts.
- `eks_ami_releases.json`: the amazon-eks-ami releases and the Kubernetes versions each ships an AL2023 x86_64
  NVIDIA AMI for, written by `tools/eks_ami_releases.py` from the repository's CHANGELOG.md. Karpenter resolves
  the pinned alias `al2023@<release>` to that release's SSM parameter for the cluster's version; a release
  without one leaves the EC2NodeClass never ready, so the config refuses such a pin.
- `instance_regions.json`: the regions that offer an instance type a pool adds only where offered (p5.48xlarge in
  the large tier's eight-GPU pools), read by `infra/facts/instance_regions.py`.

Every check takes the date it judges by (`on`), so no test turns red because the calendar moved; the commands
pass today's date. A table whose facts are more than `MAX_AGE_DAYS` old (its source's date where it records one,
else the day it was checked) makes the plan and preflight say so.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.facts.table import FactsError as FactsError
from infra.facts.table import FactsTable

FACTS_DIR = Path(__file__).resolve().parent
CALENDAR_FILE = FACTS_DIR / "eks_versions.json"
AMI_RELEASES_FILE = FACTS_DIR / "eks_ami_releases.json"
MAX_AGE_DAYS = 120
MIN_STANDARD_DAYS = 60
_ALIAS = re.compile(r"^al2023@(v\d{8})$")


class EksVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    standard_support_end: date
    extended_support_end: date


class EksCalendar(FactsTable):
    versions: dict[str, EksVersion]


class AmiRelease(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kubernetes: list[str] = Field(description="Versions with an AL2023 x86_64 NVIDIA AMI in this release")


class AmiReleases(FactsTable):
    source_as_of: date = Field(description="The newest state of the source the table was read from")
    releases: dict[str, AmiRelease]


@cache
def calendar() -> EksCalendar:
    return EksCalendar.model_validate_json(CALENDAR_FILE.read_text())


@cache
def ami_releases() -> AmiReleases:
    return AmiReleases.model_validate_json(AMI_RELEASES_FILE.read_text())


def minor(version: str) -> int:
    """36 for "1.36": EKS runs Kubernetes 1.x, so versions compare by their minor."""
    major, _, minor_part = version.partition(".")
    if major != "1" or not minor_part.isdigit():
        raise FactsError(f"{version!r} is not a Kubernetes minor version like 1.36")
    return int(minor_part)


def version_support(version: str) -> EksVersion:
    try:
        return calendar().versions[version]
    except KeyError:
        known = ", ".join(sorted(calendar().versions, key=lambda v: [int(p) for p in v.split(".")]))
        raise FactsError(
            f"Kubernetes {version} is not in infra/facts/eks_versions.json (has {known}); add its EKS support "
            "dates from AWS's version calendar, with the day you checked them"
        ) from None


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def extended_support_hours(version: str, start: date, hours: float) -> float:
    """Hours of [start, start + hours) that a cluster on `version` spends in extended support."""
    support = version_support(version)
    window_start, window_end = _midnight(start), _midnight(start) + timedelta(hours=hours)
    begin = max(window_start, _midnight(support.standard_support_end))
    end = min(window_end, _midnight(support.extended_support_end))
    return max(0.0, (end - begin).total_seconds() / 3600)


def support_warning(version: str, on: date) -> str | None:
    """What to say on `on` about the pinned version's support window; None while it has time left."""
    support = version_support(version)
    fix = "raise llm-batch:eks.version one minor version at a time (docs/deploy-eks.md)"
    if on < support.standard_support_end:
        days = (support.standard_support_end - on).days
        if days >= MIN_STANDARD_DAYS:
            return None
        return (
            f"Kubernetes {version} leaves EKS standard support on {support.standard_support_end} (in {days} "
            f"day{'s' if days != 1 else ''}): "
            f"{fix} before then; after it a cluster on {version} is billed extended support (six times the "
            "control plane's price) or, under the STANDARD upgrade policy, upgraded by AWS"
        )
    if on < support.extended_support_end:
        return (
            f"Kubernetes {version} left EKS standard support on {support.standard_support_end}: a cluster on it is "
            f"billed extended support until {support.extended_support_end} (the estimate includes it); {fix}"
        )
    return (
        f"Kubernetes {version} left EKS extended support on {support.extended_support_end}: AWS upgrades such "
        f"clusters itself; {fix}"
    )


def stale_warnings(on: date) -> list[str]:
    """A line for each facts table whose facts are more than MAX_AGE_DAYS old on `on`: judged by the date of the
    source it was read from where the table records one (the AMI releases and the instance types' regions: a
    table re-read today from a July source still holds July's facts), else by the day it was checked."""
    from infra.facts.instance_regions import INSTANCE_REGIONS_FILE, instance_regions
    from infra.pricing.idle_cost import PRICES_FILE as IDLE_PRICES
    from infra.pricing.idle_cost import load_idle_prices
    from infra.pricing.per_token import MANAGED_TABLE, managed_table
    from workload.contract.engine_sizing import GPU_KINDS_FILE, gpu_kinds

    checked = "was checked against its source on"
    tables = [
        (f"infra/facts/{CALENDAR_FILE.name}", checked, calendar().checked, calendar().how),
        (
            f"infra/facts/{AMI_RELEASES_FILE.name}",
            f"was read (on {ami_releases().checked}) from its source as of",
            ami_releases().source_as_of,
            ami_releases().how,
        ),
        (
            f"infra/facts/{INSTANCE_REGIONS_FILE.name}",
            f"was read (on {instance_regions().checked}) from its source as of",
            instance_regions().source_as_of,
            instance_regions().how,
        ),
        # The GPU kinds the engines are sized for, and the managed batch prices the estimate compares with.
        (f"workload/contract/{GPU_KINDS_FILE.name}", checked, gpu_kinds().checked, gpu_kinds().how),
        (f"infra/pricing/{MANAGED_TABLE.name}", checked, managed_table().as_of, managed_table().how),
        # What the estimate bills a stack with no run: secrets, transitions, the tick's listings, the free tier.
        (f"infra/facts/{IDLE_PRICES.name}", checked, load_idle_prices().checked, load_idle_prices().how),
        # Instance prices entered with their own date (the GPU price cut of June 2025).
        *_dated_price_rows(),
    ]
    lines = []
    for name, what, dated, how in tables:
        age = (on - dated).days
        if age > MAX_AGE_DAYS:
            lines.append(f"{name} {what} {dated}, {age} days ago (more than {MAX_AGE_DAYS}): refresh it ({how})")
    return lines


def _dated_price_rows() -> list[tuple[str, str, date, str]]:
    """(name, what, date, how) of each prices.json row that carries its own date."""
    from infra.pricing.table import load_prices

    rows = []
    for region, prices in load_prices().regions.items():
        for instance_type, row in prices.ec2.items():
            if row.as_of:
                how = f"python -m infra.pricing.refresh --region {region} --instance-type {instance_type}"
                name = f"infra/pricing/prices.json {instance_type} ({region})"
                rows.append((name, "was seen at its source on", date.fromisoformat(row.as_of), how))
    return rows


def calendar_warnings(version: str | None, on: date) -> list[str]:
    """What the plan and preflight say on `on`: the support window of `version` (None: no cluster), stale tables."""
    warning = support_warning(version, on) if version else None
    return [*([warning] if warning else []), *stale_warnings(on)]


def alias_ssm_parameter(alias: str, kubernetes: str, variant: str = "nvidia", arch: str = "x86_64") -> str:
    """The SSM parameter Karpenter reads for a pinned AL2023 alias (karpenter-provider-aws amifamily/al2023.go)."""
    release = _release_of(alias)
    name = f"amazon-eks-node-al2023-{arch}-{variant}-{kubernetes}-{release}"
    return f"/aws/service/eks/optimized-ami/{kubernetes}/amazon-linux-2023/{arch}/{variant}/{name}/image_id"


def _release_of(alias: str) -> str:
    match = _ALIAS.match(alias)
    if not match:
        raise FactsError(f"{alias!r} is not a pinned AL2023 alias like al2023@v20260714")
    return match.group(1)


def alias_problem(alias: str, kubernetes: str) -> str | None:
    """Why Karpenter would find no GPU AMI for `alias` on `kubernetes`, or None. Only AL2023 aliases are listed."""
    if not alias.startswith("al2023@"):
        return None
    release = _release_of(alias)
    table = ami_releases()
    found = table.releases.get(release)
    if found is None:
        newest = max(table.releases)
        return (
            f"{alias}: amazon-eks-ami has no release {release} in infra/facts/eks_ami_releases.json (as of "
            f"{table.source_as_of}; newest {newest}); pin a release listed there, or refresh the table"
        )
    if kubernetes not in found.kubernetes:
        offering = sorted((r for r, v in table.releases.items() if kubernetes in v.kubernetes), reverse=True)
        hint = f" (newest that does: {offering[0]})" if offering else ""
        return (
            f"{alias}: release {release} ships no AL2023 NVIDIA AMI for Kubernetes {kubernetes} (it has "
            f"{', '.join(found.kubernetes)}){hint}"
        )
    return None
