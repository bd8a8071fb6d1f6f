"""One key of a key source, with the name it is known by and whether it is an admin's.

A key's *name* is what the data it makes belongs to (the Batch API's records are owned by the name, never by the
key's text or digest): rotating a key under the same name keeps its owner's files and batches. A key given without
a name (the older forms: a bare line, a bare string in `{"keys": [...]}`, `LLM_BATCH_API_KEY`) is named by its
digest prefix (`key_id`), so records written under it before names existed stay its own.

The forms a key file or a secret's SecretString may take (keys.py reads them):
- a line `KEY`, `NAME KEY` or `NAME KEY admin` (blank lines and `#` comments ignored);
- JSON `{"keys": ["KEY", {"name": "team-a", "key": "KEY", "admin": false}, ...]}`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

KEY_ID_CHARS = 16
# A name is stored in every record it owns and shown in logs: short, printable, no separator of the line form.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")


class KeyConfigError(ValueError):
    """The key source is missing, empty or unreadable at start: the front refuses to start, in one line."""


def key_id(key: str) -> str:
    """A stable, non-secret name for a key: the first characters of its SHA-256 digest."""
    return hashlib.sha256(key.encode()).hexdigest()[:KEY_ID_CHARS]


@dataclass(frozen=True)
class KeyEntry:
    """A key's text, its name (its digest prefix when none was given) and whether it may see the project's data."""

    key: str
    name: str
    admin: bool = False

    @classmethod
    def unnamed(cls, key: str) -> KeyEntry:
        return cls(key=key, name=key_id(key))

    @classmethod
    def named(cls, key: str, name: str, admin: bool, where: str) -> KeyEntry:
        if not _NAME.match(name):
            raise KeyConfigError(
                f"{where}: key name {name[:70]!r} must be 1-64 letters, digits, '.', '_', '@' or '-', "
                "starting with a letter or digit"
            )
        return cls(key=key, name=name, admin=admin)


def _line_entry(line: str, number: int) -> KeyEntry:
    fields = line.split()
    where = f"line {number} of the key source"
    if len(fields) == 1:
        return KeyEntry.unnamed(fields[0])
    if len(fields) == 2:
        return KeyEntry.named(fields[1], fields[0], False, where)
    if len(fields) == 3 and fields[2] == "admin":
        return KeyEntry.named(fields[1], fields[0], True, where)
    # The line is not echoed: it holds a key.
    raise KeyConfigError(f"{where} has {len(fields)} fields; a line is KEY, NAME KEY or NAME KEY admin")


def _json_entry(item: Any, index: int) -> KeyEntry | None:
    where = f"keys[{index}] of the key secret"
    if isinstance(item, str):
        return KeyEntry.unnamed(item.strip()) if item.strip() else None
    if not isinstance(item, dict) or not isinstance(item.get("key"), str) or not isinstance(item.get("name"), str):
        raise KeyConfigError(f'{where} must be a string or {{"name": "...", "key": "...", "admin": false}}')
    unknown = sorted(set(item) - {"name", "key", "admin"})
    if unknown:
        raise KeyConfigError(f"{where} has unknown fields {unknown}; a key takes name, key and admin")
    admin = item.get("admin", False)
    if not isinstance(admin, bool):
        raise KeyConfigError(f"{where}: admin must be true or false")
    return KeyEntry.named(item["key"].strip(), item["name"], admin, where)


def parse_entries(text: str) -> tuple[KeyEntry, ...]:
    """The keys of a key file's text or a secret's SecretString (the module docstring's forms)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise KeyConfigError(f"the key secret is JSON but does not parse: {error.msg}") from None
        keys = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(keys, list):
            raise KeyConfigError('a JSON key secret must be {"keys": ["key", ...]}')
        found = (_json_entry(item, index) for index, item in enumerate(keys))
        return _distinct(tuple(entry for entry in found if entry is not None and entry.key))
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            entries.append(_line_entry(line, number))
    return _distinct(tuple(entries))


def _distinct(entries: tuple[KeyEntry, ...]) -> tuple[KeyEntry, ...]:
    """One key under two names would make its owner depend on the order of the lines: refused."""
    names: dict[str, str] = {}
    for entry in entries:
        if names.setdefault(entry.key, entry.name) != entry.name:
            raise KeyConfigError(f"one key is listed under two names, {names[entry.key]!r} and {entry.name!r}")
    return entries


def check_length(entries: tuple[KeyEntry, ...], min_chars: int, described: str) -> None:
    """Every key at least `min_chars` long; the refusal names the key by its name (never its text)."""
    short = [entry.name for entry in entries if len(entry.key) < min_chars]
    if short:
        raise KeyConfigError(
            f"the {described} holds keys shorter than {min_chars} characters ({', '.join(short)}): "
            f"make keys of at least {min_chars} random characters (e.g. `openssl rand -hex 24`)"
        )
