"""What every plan check shares: the plan's shape, a violation, and the guard against checking nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Resource = Mapping[str, Any]
Plan = Sequence[Resource]


@dataclass(frozen=True)
class Violation:
    check: str
    resource: str  # "<type token> <logical name>"
    problem: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.resource}: {self.problem}"


class NothingMatched(AssertionError):
    """A check found no resource to check: the plan or the check is wrong, never a pass."""


def label(resource: Resource) -> str:
    return f"{resource['type']} {resource['name']}"


def require_matches(check: str, matched: int, what: str) -> None:
    if matched == 0:
        raise NothingMatched(f"{check}: the plan has no {what}; nothing was checked")
