"""Logs Insights saved queries: the `.query` files next to this module, and a structural check of them.

No Logs Insights engine runs outside AWS, so `check_query` checks what can go wrong silently: a command
Logs Insights does not have, an unbalanced quote or parenthesis, or a field the job never logs (a query over
a renamed field returns nothing rather than failing). Pulumi runs it before it creates a query definition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from workload.contract.metric_names import LOG_FIELDS

QUERIES_DIR = Path(__file__).resolve().parent / "queries"

COMMANDS = frozenset({"fields", "filter", "stats", "sort", "limit", "parse", "display", "dedup", "unmask"})
_KEYWORDS = frozenset({"by", "as", "and", "or", "not", "asc", "desc", "like", "in", "is"})
_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')"""
    r"|(?P<regex>/(?:[^/\\]|\\.)+/)"
    r"|(?P<number>\d+(?:\.\d+)?[a-z]*)"  # 60000, 0.5, and bin periods such as 1h
    r"|(?P<name>@?[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<other>\S)"
)


class QueryError(ValueError):
    """A saved query that would fail or return nothing; the message names the file and the problem."""


@dataclass(frozen=True)
class SavedQuery:
    name: str  # the file's stem, e.g. "slow_batches"
    text: str
    event: str  # the job log event it reads
    fields: frozenset[str]  # job log fields it references


def strip_comments(text: str) -> str:
    lines = []
    for line in text.splitlines():
        quote = None
        for index, char in enumerate(line):
            if quote:
                quote = None if char == quote else quote
            elif char in "\"'":
                quote = char
            elif char == "#":
                line = line[:index]
                break
        lines.append(line)
    return "\n".join(lines)


def _split_commands(text: str) -> list[str]:
    commands: list[str] = []
    current: list[str] = []
    quote: str | None = None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "|":
            commands.append("".join(current))
            current = []
            continue
        current.append(char)
    if quote:
        raise QueryError(f"unclosed {quote} quote")
    commands.append("".join(current))
    return [command.strip() for command in commands]


def check_query(name: str, text: str) -> SavedQuery:
    """Parse a query's structure and return what it reads; raise QueryError naming the problem."""
    try:
        commands = _split_commands(strip_comments(text))
    except QueryError as error:
        raise QueryError(f"query {name}: {error}") from None
    aliases: set[str] = set()
    referenced: set[str] = set()
    events: set[str] = set()
    for command in commands:
        if not command:
            raise QueryError(f"query {name}: empty command (a stray '|')")
        keyword = command.split()[0]
        if keyword not in COMMANDS:
            raise QueryError(f"query {name}: unknown command {keyword!r}")
        tokens = [(match.lastgroup, match.group()) for match in _TOKEN.finditer(command[len(keyword) :])]
        depth = 0
        for index, (kind, value) in enumerate(tokens):
            depth += value == "(" if kind == "other" else 0
            depth -= value == ")" if kind == "other" else 0
            if depth < 0:
                raise QueryError(f"query {name}: unbalanced ')' in {command!r}")
            if kind != "name" or value.lower() in _KEYWORDS or value.startswith("@"):
                continue
            following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
            previous = tokens[index - 1][1].lower() if index else ""
            if following == "(":
                continue  # a function: count, sum, bin, ...
            if previous == "as":
                aliases.add(value)
                continue
            referenced.add(value)
            if value == "event" and following == "=" and index + 2 < len(tokens):
                events.add(tokens[index + 2][1].strip("\"'"))
        if depth:
            raise QueryError(f"query {name}: unbalanced '(' in {command!r}")
    if len(events) != 1:
        raise QueryError(f"query {name}: must filter on exactly one job log event, found {sorted(events)}")
    (event,) = events
    if event not in LOG_FIELDS:
        raise QueryError(f"query {name}: the job logs no event {event!r} (it logs {sorted(LOG_FIELDS)})")
    unknown = referenced - aliases - set(LOG_FIELDS[event])
    if unknown:
        raise QueryError(f"query {name}: fields {sorted(unknown)} are not in the job's {event} log lines")
    return SavedQuery(name=name, text=text.strip() + "\n", event=event, fields=frozenset(referenced - aliases))


def load_queries(directory: Path = QUERIES_DIR) -> list[SavedQuery]:
    """Every `.query` file in the folder, checked, sorted by name."""
    files = sorted(directory.glob("*.query"))
    if not files:
        raise QueryError(f"no .query files in {directory}")
    return [check_query(file.stem, file.read_text()) for file in files]
