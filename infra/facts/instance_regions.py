"""Which AWS regions offer the instance types a pool lists only where they are offered (`instance_regions.json`).

EC2 types are regional: p5.48xlarge is sold in a dozen regions, not all. The large tier's eight-GPU pools add it
where this table lists the stack's region for it (`eks.eight_gpu.where_offered`, infra/config/regional_types.py).
A region the table does not list is taken as not offering the type, so the pools leave it out: that loses a
choice, while listing a type the region lacks would have the estimate price nodes Karpenter can never launch.

The table records its source, the source's date (`source_as_of`) and the day it was read; like the AMI releases,
it is judged stale by the source's date (infra/facts `stale_warnings`): re-reading an old source changes nothing.
"""

from __future__ import annotations

import re
from datetime import date
from functools import cache
from pathlib import Path

from pydantic import Field, field_validator

from infra.facts.table import FactsError, FactsTable

INSTANCE_REGIONS_FILE = Path(__file__).resolve().parent / "instance_regions.json"
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")


class InstanceRegions(FactsTable):
    source_as_of: date = Field(description="The newest state of the source the table was read from")
    instance_types: dict[str, list[str]] = Field(description="Instance type -> the regions that offer it")

    @field_validator("instance_types")
    @classmethod
    def _regions(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for instance_type, regions in value.items():
            bad = [region for region in regions if not _REGION.match(region)]
            if not regions or bad:
                raise ValueError(f"{instance_type}: {bad or 'no regions'} is not a list of AWS region names")
        return value


@cache
def instance_regions() -> InstanceRegions:
    return InstanceRegions.model_validate_json(INSTANCE_REGIONS_FILE.read_text())


def regions_offering(instance_type: str) -> list[str]:
    """The regions the table lists for `instance_type`; a FactsError naming the table when it has no row for it."""
    table = instance_regions().instance_types
    try:
        return table[instance_type]
    except KeyError:
        raise FactsError(
            f"{instance_type} is not in infra/facts/{INSTANCE_REGIONS_FILE.name} (has {', '.join(sorted(table))}); "
            f"add the regions that offer it, with its source and date ({instance_regions().how})"
        ) from None


def offers(instance_type: str, region: str) -> bool:
    return region in regions_offering(instance_type)
