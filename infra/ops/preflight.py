"""Preflight: does the account hold what the stack needs before `pulumi up`? Say what to do if not.

EC2 counts running (and requested Spot) vCPUs per instance family against a Service Quotas quota, and new
accounts start GPU families at 0, so `pulumi up` would create everything and then fail at the first GPU node.
`python -m infra.preflight STACK` reads the quotas first and prints the request to file for each one short.
The small tier's quota holds two nodes: capacity rebalancing starts the replacement beside the node it
replaces. Then the account itself (infra/ops/preflight_account.py): the EC2 Spot service-linked role and the
AMI alias's SSM parameter (Karpenter's tiers), the zones that offer the tier's instance types, the deployed
cluster's Kubernetes version against `eks.version` (the EKS tiers), the Batch API functions' reserved concurrency
against the account's Lambda quota (where the API is on), and the dated facts' warnings (the Kubernetes version's
support window).

Tests replay recorded Service Quotas answers through botocore's Stubber: moto's Service Quotas backend
serves only the `vpc` service code, not EC2's vCPU quotas.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from infra.pricing.estimate import Capacity, NodePool
from infra.pricing.table import PriceTable

SERVICE_CODE = "ec2"


@dataclass(frozen=True)
class QuotaRef:
    code: str
    name: str


# (family, capacity) -> the EC2 vCPU quota the family counts against, codes as Service Quotas lists them.
QUOTAS: dict[tuple[str, Capacity], QuotaRef] = {
    ("G", "on-demand"): QuotaRef("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("G", "spot"): QuotaRef("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", "on-demand"): QuotaRef("L-417A185B", "Running On-Demand P instances"),
    ("P", "spot"): QuotaRef("L-7212CCBC", "All P Spot Instance Requests"),
    ("Standard", "on-demand"): QuotaRef(
        "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
    ),
    ("Standard", "spot"): QuotaRef("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
_STANDARD = frozenset("acdhimrtz")


class PreflightError(RuntimeError):
    """Service Quotas could not be read; the message names the quota and the cause."""


@dataclass(frozen=True)
class QuotaCheck:
    quota: QuotaRef
    needed_vcpus: int
    limit_vcpus: float
    instance_types: tuple[str, ...]
    # A fallback check: what Karpenter needs to fall back to another type; it does not fail the preflight.
    fallback: bool = False

    @property
    def ok(self) -> bool:
        return self.limit_vcpus >= self.needed_vcpus


def family(instance_type: str) -> str:
    """The quota family of an instance type: G (g and vt), P, or Standard; others are not handled here."""
    match = re.fullmatch(r"([a-z]+)\d+[a-z-]*\.[a-z0-9]+", instance_type)
    if not match:
        raise ValueError(f"{instance_type!r} is not an EC2 instance type like g5.xlarge")
    letters = match.group(1)
    if letters in ("g", "vt"):
        return "G"
    if letters == "p":
        return "P"
    if letters[0] in _STANDARD and letters not in ("inf", "dl", "trn"):
        return "Standard"
    raise ValueError(f"{instance_type!r}: family {letters!r} has no quota mapping in infra/ops/preflight.py")


def needed_vcpus(pools: Iterable[NodePool], region: str, prices: PriceTable) -> dict[QuotaRef, tuple[int, set[str]]]:
    """vCPUs each quota must allow when every pool runs at its count at once (counts round up)."""
    needs: dict[QuotaRef, tuple[int, set[str]]] = {}
    for pool in pools:
        if pool.count <= 0:
            continue
        quota = QUOTAS[(family(pool.instance_type), pool.capacity)]
        vcpus = math.ceil(pool.count) * prices.instance(region, pool.instance_type).vcpus
        total, types = needs.get(quota, (0, set()))
        needs[quota] = (total + vcpus, types | {pool.instance_type})
    return needs


def quota_value(client: Any, quota: QuotaRef) -> float:
    """The account's applied quota; AWS's default where the account never changed it (NoSuchResource)."""
    try:
        return float(client.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=quota.code)["Quota"]["Value"])
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "NoSuchResourceException":
            raise PreflightError(f"reading quota {quota.code} ({quota.name}) failed: {err}") from err
    except BotoCoreError as err:
        raise PreflightError(f"reading quota {quota.code} ({quota.name}) failed: {err}") from err
    try:
        response = client.get_aws_default_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=quota.code)
    except (ClientError, BotoCoreError) as err:
        raise PreflightError(f"reading the default of quota {quota.code} ({quota.name}) failed: {err}") from err
    return float(response["Quota"]["Value"])


def check_quotas(
    client: Any,
    pools: Iterable[NodePool],
    region: str,
    prices: PriceTable,
    fallback: Iterable[NodePool] = (),
) -> list[QuotaCheck]:
    """A check per quota the pools use, in quota-code order, and a fallback check where `fallback` adds one.

    A fallback check asks for the required vCPUs of that quota plus one node of its largest fallback type.
    """
    needs = needed_vcpus(pools, region, prices)
    extra: dict[QuotaRef, tuple[int, set[str]]] = {}
    for pool in fallback:
        quota = QUOTAS[(family(pool.instance_type), pool.capacity)]
        vcpus = prices.instance(region, pool.instance_type).vcpus
        largest, types = extra.get(quota, (0, set()))
        extra[quota] = (max(largest, vcpus), types | {pool.instance_type})
    checks = []
    for quota in sorted(set(needs) | set(extra), key=lambda ref: ref.code):
        limit = quota_value(client, quota)
        needed, types = needs.get(quota, (0, set()))
        if quota in needs:
            checks.append(QuotaCheck(quota, needed, limit, tuple(sorted(types))))
        if quota in extra:
            largest, fallback_types = extra[quota]
            checks.append(QuotaCheck(quota, needed + largest, limit, tuple(sorted(fallback_types)), fallback=True))
    return checks


def format_checks(checks: list[QuotaCheck], region: str) -> str:
    lines = [f"EC2 vCPU quotas in {region} (what the stack launches at its largest):"]
    for check in checks:
        status = "ok" if check.ok else ("low" if check.fallback else "TOO LOW")
        what = "to fall back to" if check.fallback else "for"
        lines.append(
            f"  {status:<8} {check.quota.code} {check.quota.name}: need {check.needed_vcpus} vCPUs "
            f"{what} {', '.join(check.instance_types)}, quota {check.limit_vcpus:g}"
        )
    fallback_short = [check for check in checks if check.fallback and not check.ok]
    if fallback_short:
        lines.append(
            "Karpenter cannot fall back to the types marked 'low' (it keeps to the others); raise those "
            "quotas to let it: " + ", ".join(f"{c.quota.code} to {c.needed_vcpus}" for c in fallback_short)
        )
    short = [check for check in checks if not check.ok and not check.fallback]
    if short:
        lines.append("Request these increases before `pulumi up` (GPU requests can take a day or more):")
        for check in short:
            lines.append(
                f"  aws service-quotas request-service-quota-increase --region {region} --service-code ec2 "
                f"--quota-code {check.quota.code} --desired-value {check.needed_vcpus}"
            )
        lines.append("The quota is shared with anything else in the account and region: ask for that too.")
    else:
        lines.append("All quotas cover the stack (other workloads in the account share them).")
    return "\n".join(lines)


class RecordedQuotas:
    """Quotas saved with `aws service-quotas list-service-quotas --service-code ec2 --output json`, read like the API.

    For a machine that may not call Service Quotas (a review, CI): the saved answer stands in for the live one.
    A quota the file lacks is an error naming it, never a guessed value.
    """

    def __init__(self, path: str) -> None:
        import json
        from pathlib import Path

        document = json.loads(Path(path).read_text())
        if not isinstance(document, dict) or not isinstance(document.get("Quotas"), list):
            raise PreflightError(
                f"{path}: expected the JSON of `aws service-quotas list-service-quotas` (Quotas: [...])"
            )
        self.path = path
        self.values = {item["QuotaCode"]: float(item["Value"]) for item in document["Quotas"]}

    def get_service_quota(self, ServiceCode: str, QuotaCode: str) -> dict[str, Any]:
        if QuotaCode not in self.values:
            raise PreflightError(
                f"{self.path} has no quota {QuotaCode}; save the list again with "
                "`aws service-quotas list-service-quotas --service-code ec2 --output json`"
            )
        return {"Quota": {"ServiceCode": ServiceCode, "QuotaCode": QuotaCode, "Value": self.values[QuotaCode]}}


def run(stack: str, client: Any, clients: Any = None, on: date | None = None) -> tuple[bool, str]:
    """(everything checked holds, the report) for a stack's config: quotas through `client`, the account through
    `clients(service)` (None: not asked, as with `--quotas`), dated facts as of `on` (default today, UTC)."""
    from infra import naming
    from infra.ops.checks_engine_fit import check_engine_fit
    from infra.ops.preflight_account import account_findings, format_findings, skipped
    from infra.ops.preflight_lambda import lambda_findings
    from infra.ops.stacks import offline_config
    from infra.pricing.stack_costs import capacity_pools
    from infra.pricing.table import load_prices

    config = offline_config(stack)
    prices = load_prices()
    required, fallback = capacity_pools(config, prices)
    checks = check_quotas(client, required, config.region, prices, fallback)
    fit = check_engine_fit(config, prices)  # the model on the tier's GPUs, from its config.json
    ok = all(check.ok for check in checks if not check.fallback) and fit.ok
    report = f"{format_checks(checks, config.region)}\n{fit.line}"
    if clients is None:
        return ok, f"{report}\n{skipped(config)}"
    findings = account_findings(config, clients, on or datetime.now(UTC).date(), naming.prefix(stack))
    findings += lambda_findings(config, clients, stack)
    return ok and all(finding.ok for finding in findings), f"{report}\n{format_findings(findings)}"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    import boto3

    from infra.config import StackConfigError
    from infra.ops.plan import PlanError
    from infra.ops.stacks import offline_config
    from workload.contract.cli_errors import EXIT_AWS, HELP_EPILOG, CommandError, describe

    parser = argparse.ArgumentParser(
        prog="python -m infra.preflight",
        description=__doc__.splitlines()[0],
        epilog="examples: python -m infra.preflight small; python -m infra.preflight large --quotas quotas.json. "
        "Exit 1: a quota is short (the request to file is printed), or the account lacks what the stack needs "
        f"(the command that makes it is printed). {HELP_EPILOG}",
    )
    parser.add_argument("stack", help="stack name: stacks/Pulumi.<stack>.yaml holds its config")
    parser.add_argument(
        "--quotas",
        metavar="FILE",
        help="saved `aws service-quotas list-service-quotas --service-code ec2 --output json` instead of asking "
        "AWS; the account's other checks are then skipped (and named)",
    )
    args = parser.parse_args(argv)
    try:
        region = offline_config(args.stack).region
        if args.quotas:
            ok, report = run(args.stack, RecordedQuotas(args.quotas))
        else:

            def clients(service: str) -> Any:
                return boto3.client(service, region_name=region)

            ok, report = run(args.stack, clients("service-quotas"), clients)
    except PreflightError as error:
        cause = describe(error.__cause__) if error.__cause__ is not None else None
        if cause is not None and cause.exit_code == EXIT_AWS:  # credentials, network, access: say so, and the fix
            raise CommandError(
                str(error).split(" failed:")[0] + f" failed: {cause.problem}", cause.fix, EXIT_AWS
            ) from error
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (PlanError, StackConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
