"""Which Availability Zones the stack's subnets go in: those where the tier's instance types are offered.

A region's zones do not all offer every type (g5 and p4d least of all), and a subnet in a zone without the GPU
type is a zone where no GPU node can ever start: Auto Scaling, a managed node group or Karpenter then keep
trying there, or run with fewer zones than the stack asked for. The program asks EC2 where each type is offered
(DescribeInstanceTypeOfferings, through the provider's `get_instance_type_offerings`) and picks, in order:

- zones offering every required type (the GPU type the tier runs on first, and the EKS head type);
- among them, those offering the most preferred types (Karpenter's other types, the endpoint's type);
- then by name, so the same answer always gives the same zones (a plan that does not move between runs).

`python -m infra.preflight` asks the same question of the account and prints the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


class ZoneError(ValueError):
    """Too few zones offer the required types; the message names the key and the types."""


def offered_by_zone(pairs: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """(instance type, zone) pairs, as DescribeInstanceTypeOfferings lists them, as zone -> types."""
    found: dict[str, set[str]] = {}
    for instance_type, zone in pairs:
        found.setdefault(zone, set()).add(instance_type)
    return found


def choose_zones(
    zones: Sequence[str],
    offered: Mapping[str, set[str]],
    required: Sequence[str],
    preferred: Sequence[str],
    count: int,
) -> list[str]:
    """`count` of `zones` offering every `required` type, those offering the most `preferred` types first."""
    eligible = [zone for zone in zones if set(required) <= offered.get(zone, set())]
    if len(eligible) < count:
        raise ZoneError(
            f"network.az_count is {count} but only {len(eligible)} of the zones {sorted(zones)} offer "
            f"{', '.join(required)} ({', '.join(sorted(eligible)) or 'none'}): lower network.az_count or choose "
            "instance types offered in more zones"
        )
    ranked = sorted(eligible, key=lambda zone: (-len(set(preferred) & offered.get(zone, set())), zone))
    return sorted(ranked[:count])
