"""The local server's quota flags (`--quota-open-batches 20`, ..., `--quota-priorities team-a=10,nightly=-5`): one
per field of `Quotas`, defaults its own."""

from __future__ import annotations

import argparse

from workload.batch_api.quotas import Quotas
from workload.contract.batch_api_priorities import parse_priorities


def add_quota_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("quotas per key (docs/batch-api.md, 'Quotas'); over one: 429 or 400")
    for name in Quotas.counts():
        field = Quotas.model_fields[name]
        flag = "--quota-" + name.replace("_", "-")
        group.add_argument(flag, type=int, default=field.default, help=f"{field.description} Default {field.default}.")
    description = Quotas.model_fields["priorities"].description
    group.add_argument("--quota-priorities", default="", metavar="NAME=N,...", help=f"{description} Default none.")


def quotas_from_args(args: argparse.Namespace) -> Quotas:
    """The flags as `Quotas`; a value below 1, or a priority that is not NAME=N in range, is a ValueError naming
    the flag."""
    counts = {name: getattr(args, "quota_" + name) for name in Quotas.counts()}
    return Quotas(**counts, priorities=parse_priorities(args.quota_priorities, "--quota-priorities"))
