"""The local server's quota flags (`--quota-open-batches 20`, ...): one per field of `Quotas`, defaults its own."""

from __future__ import annotations

import argparse

from workload.batch_api.quotas import Quotas


def add_quota_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("quotas per key (docs/batch-api.md, 'Quotas'); over one: 429 or 400")
    for name, field in Quotas.model_fields.items():
        flag = "--quota-" + name.replace("_", "-")
        group.add_argument(flag, type=int, default=field.default, help=f"{field.description} Default {field.default}.")


def quotas_from_args(args: argparse.Namespace) -> Quotas:
    """The flags as `Quotas`; a value below 1 is a ValueError (pydantic's) naming the quota."""
    return Quotas(**{name: getattr(args, "quota_" + name) for name in Quotas.model_fields})
