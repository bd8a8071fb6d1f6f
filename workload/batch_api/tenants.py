"""Who a request acts for, and which records it may see (issue 60: tenants apart).

Key scope (the default everywhere): each key's *name* (workload/auth/entries.py) is a tenant, `key-NAME`; a record
is seen only by the tenant that made it, and another tenant's id answers as an unknown one (404), so ids cannot be
probed. A key renamed is a new tenant; a key rotated under the same name keeps its records.

Records written in project scope (before key scope was the default, or by a server run with `--scope project`)
belong to the project (`PROJECT_OWNER`): in key scope only an admin key (flagged `admin` in the key source) sees
them, beside its own. A loopback server without keys has one tenant, `local`.

`Tenant` is a `str` (the owner its new records carry, what the service stores and compares) that also knows
whether it is an admin's: the service's signatures and the stored records keep their shape, and the one rule of
who sees what is `sees` below.
"""

from __future__ import annotations

from typing import Literal

Scope = Literal["project", "key"]
DEFAULT_SCOPE: Scope = "key"
SCOPES: tuple[Scope, ...] = ("key", "project")
NO_KEY_OWNER = "local"  # the one tenant of a loopback server run without a key
PROJECT_OWNER = "project"


class Tenant(str):
    """The owner a caller's records carry; `admin`: it also sees the project's records."""

    admin: bool

    def __new__(cls, owner: str, admin: bool = False) -> Tenant:
        made = super().__new__(cls, owner)
        made.admin = admin
        return made


def sees(caller: str, record_owner: str) -> bool:
    """Whether `caller` may see a record owned by `record_owner`."""
    if record_owner == caller:
        return True
    return record_owner == PROJECT_OWNER and isinstance(caller, Tenant) and caller.admin


# The Batch API's keys are its tenants' only credential on an internet-facing endpoint: at least 32 characters
# (about 190 bits as `openssl rand -hex 24` makes them), so no key is guessable; a shorter one refuses the start.
MIN_KEY_CHARS = 32
