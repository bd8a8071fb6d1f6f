"""The eight-GPU pools' types that depend on the stack's region: p5.48xlarge where the region offers it.

`eks.eight_gpu.where_offered` names types the large tier's eight-GPU pools (its Spot NodePool and the on-demand
fallback made from it) list only in regions that sell them, per the dated table infra/facts/instance_regions.json.
They are added to `eks.eight_gpu.node_pool.instance_types` before the config is validated, so every reader of the
pool (the NodePools, the fit and disk checks, the estimate's worst hour) sees the one list Karpenter gets; the
plan prints the choice (`choice_line`). A type the stack lists itself stays listed whatever the table says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from infra.facts import instance_regions
from infra.facts.table import FactsError

if TYPE_CHECKING:
    from infra.config.stack import StackConfig

TABLE = f"infra/facts/{instance_regions.INSTANCE_REGIONS_FILE.name}"


def with_offered_types(
    data: Any, default_region: str, default_pool: Mapping[str, Any], default_offered: list[str]
) -> Any:
    """The stack's raw config with the `eks.eight_gpu.where_offered` types its region offers appended to
    `eks.eight_gpu.node_pool.instance_types`. The defaults stand in for keys the stack leaves out (a stack without
    its own `node_pool` gets the whole default pool, not NodePoolArgs' one-GPU defaults). Values of the wrong shape
    are left as they are, for the config model to refuse with their key."""
    if not isinstance(data, Mapping):
        return data
    eks = data.get("eks", {})
    wide = eks.get("eight_gpu", {}) if isinstance(eks, Mapping) else None
    pool = wide.get("node_pool", default_pool) if isinstance(wide, Mapping) else None
    # Only Karpenter's tier has the eight-GPU pools; elsewhere the section is never rendered.
    if (
        not isinstance(wide, Mapping)
        or not isinstance(pool, Mapping)
        or str(eks.get("karpenter_enabled")).lower() != "true"
    ):
        return data
    region = data.get("region", default_region)
    types = pool.get("instance_types", default_pool["instance_types"])
    offered = wide.get("where_offered", default_offered)
    if not isinstance(region, str) or not _strings(types) or not _strings(offered):
        return data
    try:
        added = [t for t in offered if t not in types and instance_regions.offers(t, region)]
    except FactsError:
        return data  # a type the table lacks: the where_offered field's own check names the table
    if not added:
        return data
    return {
        **data,
        "eks": {**eks, "eight_gpu": {**wide, "node_pool": {**pool, "instance_types": [*types, *added]}}},
    }


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(each, str) for each in value)


def choice_line(config: StackConfig) -> str | None:
    """What the plan says of each `where_offered` type on Karpenter's tier: in the pools or left out, and why."""
    wide = config.eks.eight_gpu
    if config.tier == "small" or not config.eks.karpenter_enabled or not wide.enabled or not wide.where_offered:
        return None
    table = instance_regions.instance_regions()
    parts = []
    for instance_type in wide.where_offered:
        offered = instance_regions.offers(instance_type, config.region)
        listed = instance_type in wide.node_pool.instance_types
        if listed and offered:
            parts.append(f"{instance_type} in the pools: {config.region} offers it")
        elif listed:
            parts.append(
                f"{instance_type} in the pools as the stack lists it, though the table does not list {config.region}"
            )
        else:
            regions = ", ".join(instance_regions.regions_offering(instance_type))
            parts.append(
                f"{instance_type} left out: the table does not list {config.region} for it (it lists {regions})"
            )
    return f"eight-GPU pools (eks.eight_gpu): {'; '.join(parts)} ({TABLE}, source as of {table.source_as_of})"
