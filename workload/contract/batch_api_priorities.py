"""The Batch API's priority per key (issue 62): `batch_api.quotas.priorities` in the stack's config, the local
server's `--quota-priorities`, the front's LLM_BATCH_QUOTA_PRIORITIES, one model mixed into `BatchApiQuotas`.

A priority is an integer from PRIORITY_MIN to PRIORITY_MAX; a larger one runs first (as Kubernetes'
PriorityClass values). A key not listed has DEFAULT_PRIORITY. The names are the keys' names in the key source
(workload/auth/entries.py: 1-64 letters, digits, '.', '_', '@', '-'), so the text form `team-a=10,nightly=-5`
needs no quoting: a name holds neither '=' nor ','. A batch may lower its own priority with the metadata key
METADATA_KEY, never raise it (workload/batch_api/priorities.py applies both).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

PRIORITY_MIN, PRIORITY_MAX, DEFAULT_PRIORITY = -100, 100, 0
METADATA_KEY = "llm_batch_priority"
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")  # workload/auth/entries.py's rule for a key's name
_NUMBER = re.compile(r"^[+-]?\d{1,4}$")


def parse_priority(text: str, where: str) -> int:
    """One priority written as text (`-5`); a ValueError naming `where` when it is not an integer in range."""
    value = text.strip()
    if not _NUMBER.match(value) or not PRIORITY_MIN <= int(value) <= PRIORITY_MAX:
        raise ValueError(f"{where} must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, got {text!r}")
    return int(value)


def parse_priorities(text: str, setting: str) -> dict[str, int]:
    """`team-a=10,nightly=-5` (blank: none) as a mapping; a ValueError naming `setting` and the bad pair."""
    found: dict[str, int] = {}
    for pair in (part.strip() for part in text.split(",")):
        if not pair:
            continue
        name, sign, value = pair.partition("=")
        name = name.strip()
        if not sign or not _KEY_NAME.match(name):
            raise ValueError(f"{setting}: {pair!r} is not NAME=PRIORITY with a key's name (e.g. team-a=10)")
        if name in found:
            raise ValueError(f"{setting}: key {name!r} is given twice")
        found[name] = parse_priority(value, f"{setting}: {name}'s priority")
    return found


def priorities_text(priorities: dict[str, int]) -> str:
    """The text form `parse_priorities` reads (what the stack passes to the front)."""
    return ",".join(f"{name}={value}" for name, value in sorted(priorities.items()))


class PrioritiesMixin(BaseModel):
    """The priorities field, mixed into BatchApiQuotas (workload/contract/batch_api_quotas.py)."""

    priorities: dict[str, int] = Field(
        default_factory=dict,
        description=f"Queue priority per key name ({PRIORITY_MIN} to {PRIORITY_MAX}, larger runs first; a key not "
        f"listed: {DEFAULT_PRIORITY}). A batch may lower its own with metadata `{METADATA_KEY}`, never raise it.",
    )

    @field_validator("priorities")
    @classmethod
    def _named_keys_in_range(cls, value: dict[str, int]) -> dict[str, int]:
        for name, priority in value.items():
            if not _KEY_NAME.match(name):
                raise ValueError(f"priorities: {name[:70]!r} is not a key's name (1-64 letters, digits, . _ @ -)")
            if isinstance(priority, bool) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
                raise ValueError(f"priorities: {name}'s priority must be from {PRIORITY_MIN} to {PRIORITY_MAX}")
        return value

    def key_priority(self, owner: str) -> int:
        """The priority of the owner's key: its name's in `priorities` (owners are `key-NAME` in key scope); the
        project's and the keyless local server's owner have no key: DEFAULT_PRIORITY."""
        if not owner.startswith("key-"):
            return DEFAULT_PRIORITY
        return self.priorities.get(owner.removeprefix("key-"), DEFAULT_PRIORITY)
