"""Each key's webhook (issue 63): where its batches' `batch.*` events go, and the secret they are signed with.

One document, read like the keys (workload/auth/keys.py): locally a file (`--webhooks FILE`), on the AWS tiers
the stack's Secrets Manager secret `llm-batch-<stack>/batch-api-webhooks` (`LLM_BATCH_WEBHOOKS_SECRET`), read by
the tick function alone, since only the tick sends. The signing secrets are never in the stack's config, never in
a log line (an entry's `repr` leaves them out) and never in a record. Its forms:
- a line `NAME URL SECRET` (blank lines and `#` comments ignored);
- JSON `{"webhooks": [{"name": "team-a", "url": "https://...", "secret": "whsec_..."}]}`.

`NAME` is a key's name (docs/batch-api.md, "Keys and tenancy"): the batches its key made (owner `key-NAME`) are
sent there. Two names stand for the owners that are no key's: `@project` (records made in project scope) and
`@local` (the keyless loopback server). The URL is https, or http to a loopback address (a receiver on the same
machine). The secret is Standard Webhooks': `whsec_` and the base64 of 24 to 64 random bytes, e.g.
`python -c "import base64, os; print('whsec_' + base64.b64encode(os.urandom(32)).decode())"`.

The document is re-read at most every `refresh_s` (30 s), so a rotated secret or a new URL reaches the next
sends without a restart; a re-read that fails keeps the last document that loaded and says so once, naming the
source and never its text.
"""

from __future__ import annotations

import binascii
import contextlib
import ipaddress
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workload.batch_api.events import SECRET_PREFIX, secret_bytes
from workload.batch_api.tenants import NO_KEY_OWNER, PROJECT_OWNER

ENV_SECRET = "LLM_BATCH_WEBHOOKS_SECRET"
SPECIAL_OWNERS = {"@project": PROJECT_OWNER, "@local": NO_KEY_OWNER}


class WebhookConfigError(ValueError):
    """The webhooks' document is unreadable or holds a bad entry; the message names the entry, never a secret."""


@dataclass(frozen=True)
class Webhook:
    name: str
    url: str
    secret: str = field(repr=False)  # never printed: a log line or a traceback shows the name and the URL

    @property
    def owner(self) -> str:
        return SPECIAL_OWNERS.get(self.name, f"key-{self.name}")


def _checked(name: Any, url: Any, secret: Any, where: str) -> Webhook:
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise WebhookConfigError(f"{where}: a webhook needs a key name without spaces")
    if not isinstance(url, str):
        raise WebhookConfigError(f"{where} ({name}): a webhook needs a url")
    parts = urlsplit(url)
    loopback = parts.hostname == "localhost"
    with contextlib.suppress(ValueError):  # a name, not an address
        loopback = loopback or ipaddress.ip_address(parts.hostname or "").is_loopback
    if not parts.hostname or not (parts.scheme == "https" or (parts.scheme == "http" and loopback)):
        raise WebhookConfigError(f"{where} ({name}): the url must be https (http only to a loopback address)")
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise WebhookConfigError(f"{where} ({name}): the secret must start with {SECRET_PREFIX!r}")
    try:
        size = len(secret_bytes(secret))
    except (binascii.Error, ValueError):
        raise WebhookConfigError(f"{where} ({name}): the secret after {SECRET_PREFIX!r} is not base64") from None
    if not 24 <= size <= 64:
        raise WebhookConfigError(f"{where} ({name}): the secret must hold 24 to 64 bytes, it holds {size}")
    return Webhook(name, url, secret)


def parse_webhooks(text: str) -> dict[str, Webhook]:
    """The document's webhooks by owner; WebhookConfigError naming the bad entry (never its secret)."""
    stripped = text.strip()
    found: list[Webhook] = []
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except ValueError:
            raise WebhookConfigError("the webhooks' document is not JSON") from None
        items = document.get("webhooks") if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise WebhookConfigError('the webhooks\' document must be {"webhooks": [...]}')
        for number, item in enumerate(items, start=1):
            item = item if isinstance(item, dict) else {}
            found.append(_checked(item.get("name"), item.get("url"), item.get("secret"), f"webhook {number}"))
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
            if not fields:
                continue
            if len(fields) != 3:
                raise WebhookConfigError(f"line {number} of the webhooks: NAME URL SECRET, got {len(fields)} fields")
            name, url, secret = fields
            found.append(_checked(name, url, secret, f"line {number} of the webhooks"))
    by_owner: dict[str, Webhook] = {}
    for hook in found:
        if hook.owner in by_owner:
            raise WebhookConfigError(f"key name {hook.name} has two webhooks; give it one")
        by_owner[hook.owner] = hook
    return by_owner


@dataclass
class WebhookSource:
    """Where the document is: a file, or a Secrets Manager secret (an id or ARN). Read when first asked (the tick's
    first send), not at a cold start, and again at most every `refresh_s`."""

    path: Path | None = None
    secret_id: str | None = None
    secrets_client: Any = None
    refresh_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _loaded: dict[str, Webhook] | None = field(default=None, repr=False)
    _read_at: float = field(default=float("-inf"), repr=False)
    _warned: bool = field(default=False, repr=False)

    def describe(self) -> str:
        return f"webhooks file {self.path}" if self.path else f"webhooks secret {self.secret_id}"

    def _text(self) -> str:
        if self.path is not None:
            try:
                return self.path.read_text()
            except OSError as error:
                raise WebhookConfigError(f"cannot read the {self.describe()}: {error.strerror or error}") from None
        if self.secrets_client is None:
            import boto3

            self.secrets_client = boto3.client("secretsmanager")
        try:
            value = self.secrets_client.get_secret_value(SecretId=self.secret_id)
        except Exception as error:  # ClientError, a timeout, no credentials: all mean "cannot read it now"
            code = getattr(error, "response", {}).get("Error", {}).get("Code")
            if code == "ResourceNotFoundException":  # the stack made it and nobody set a value: no webhooks yet
                return ""
            raise WebhookConfigError(f"cannot read the {self.describe()}: {type(error).__name__}") from None
        text = value.get("SecretString")
        if not isinstance(text, str):
            raise WebhookConfigError(f"the {self.describe()} has no SecretString")
        return text

    def current(self) -> dict[str, Webhook]:
        """The webhooks by owner; the last good document when a re-read fails; WebhookConfigError when none ever
        loaded (the caller keeps its events pending and tries again)."""
        now = self.clock()
        if self._loaded is not None and now - self._read_at < self.refresh_s:
            return self._loaded
        try:
            self._loaded, self._read_at, self._warned = parse_webhooks(self._text()), now, False
        except WebhookConfigError as error:
            if self._loaded is None:
                raise
            if not self._warned:
                print(f"llm-batch batch-api: {error}; keeping the webhooks last read", file=sys.stderr, flush=True)
                self._warned = True
            self._read_at = now
        return self._loaded


def check_file(path: Path) -> WebhookSource:
    """The local server's `--webhooks FILE`, read once at start so a bad file refuses the start, naming it."""
    source = WebhookSource(path=path)
    source.current()
    return source
