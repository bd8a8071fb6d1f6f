"""The choice of one of vLLM's parsers by setting: `auto`, `none` or a registered name.

Reasoning parsers (reasoning.py) and tool-call parsers (tool_calls.py) are chosen the same way: a name vLLM
registers is taken as given, `none` turns the parser off, and `auto` picks by the model's family, told by its hub id
or folder name before any download. Each module keeps its own registry, families and wording; this one keeps the rule.
"""

from __future__ import annotations

from collections.abc import Collection

AUTO, NONE = "auto", "none"

# (marker, exceptions, parser): the first family whose marker the lower-cased name holds, and none of whose
# exceptions, wins.
Families = tuple[tuple[str, tuple[str, ...], str], ...]


def check_parser(value: str, registered: Collection[str], kind: str) -> str:
    """The setting as given, or ValueError naming the choices. `kind` names the parser in the message."""
    if value in (AUTO, NONE) or value in registered:
        return value
    raise ValueError(
        f"unknown {kind} {value!r}: use 'auto', 'none' or one of vLLM 0.32's: " + ", ".join(sorted(registered))
    )


def parser_of_family(source: str, families: Families) -> str | None:
    """The parser of the first family `source` (hub id or path) belongs to, or None."""
    name = source.rstrip("/").lower()
    for marker, exceptions, parser in families:
        if marker in name and not any(word in name for word in exceptions):
            return parser
    return None
