"""Where an endpoint's API keys come from, and how a presented key is checked.

One mechanism for every front the project serves (the online endpoint, the Batch API, locally and on the tiers):
- `LLM_BATCH_API_KEY`: one key, for a single user's machine;
- a key file (`LLM_BATCH_API_KEY_FILE` or a config's path): several keys, one per line (blank lines and `#` comments
  ignored), so a key is rotated without downtime: add the new key, move clients over, remove the old one;
- a Secrets Manager secret (`LLM_BATCH_API_KEY_SECRET`, an id or ARN), the EKS tiers' source: its SecretString is
  either a JSON object `{"keys": ["...", "..."]}` or the key file's text.

A file or secret is re-read at most every `refresh_s` seconds, so a rotation reaches a running replica without a
restart. A re-read that fails (file gone, Secrets Manager unreachable) keeps the last keys that loaded and says so
once; a source that yields no key at all is an error at start, never "accept anything".

Keys are compared as SHA-256 digests with `hmac.compare_digest`, against every key each time: neither the time nor
the early exit of a comparison tells a caller how much of a key it got right, nor which key nearly matched.
A matched key is known to the rest of the program only by its name (entries.py: given in the source, or else its
`key_id`, a digest prefix), never by its text, so logs and stored records can say which key did something without
holding a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload.auth.entries import KEY_ID_CHARS, KeyConfigError, KeyEntry, check_length, key_id, parse_entries

ENV_KEY = "LLM_BATCH_API_KEY"
ENV_KEY_FILE = "LLM_BATCH_API_KEY_FILE"
ENV_KEY_SECRET = "LLM_BATCH_API_KEY_SECRET"


def parse_key_text(text: str) -> tuple[str, ...]:
    """Keys from a key file's text or a secret's SecretString (the forms entries.py reads), without their names."""
    return tuple(entry.key for entry in parse_entries(text))


@dataclass(frozen=True)
class KeySource:
    """Where the keys are; at most one of the three. `describe()` names it without any key's text."""

    key: str | None = None
    key_file: Path | None = None
    secret_id: str | None = None
    region: str | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        key_file: str | Path | None = None,
        secret_id: str | None = None,
    ) -> KeySource:
        """The source named by a config (`key_file`, `secret_id`) or else by the environment."""
        env = os.environ if env is None else env
        key = env.get(ENV_KEY) or None
        file_value = key_file or env.get(ENV_KEY_FILE) or None
        secret = secret_id or env.get(ENV_KEY_SECRET) or None
        given = [name for name, value in (("key", key), ("key_file", file_value), ("secret_id", secret)) if value]
        if len(given) > 1:
            raise KeyConfigError(
                f"API keys come from one source; got {', '.join(given)} "
                f"(set only one of {ENV_KEY}, {ENV_KEY_FILE} or {ENV_KEY_SECRET})"
            )
        return cls(
            key=key,
            key_file=Path(file_value).expanduser() if file_value else None,
            secret_id=secret,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        )

    @property
    def configured(self) -> bool:
        return bool(self.key or self.key_file or self.secret_id)

    def describe(self) -> str:
        if self.key:
            return ENV_KEY
        if self.key_file:
            return f"key file {self.key_file}"
        if self.secret_id:
            return f"Secrets Manager secret {self.secret_id}"
        return "no key source"

    def read(self, secrets_client: Any = None) -> tuple[str, ...]:
        """The keys as the source holds them now; raises KeyConfigError naming the source when it cannot."""
        return tuple(entry.key for entry in self.entries(secrets_client))

    def entries(self, secrets_client: Any = None) -> tuple[KeyEntry, ...]:
        """The keys with their names (entries.py); raises KeyConfigError naming the source when it cannot."""
        if self.key:
            entries: tuple[KeyEntry, ...] = (KeyEntry.unnamed(self.key.strip()),)
        elif self.key_file:
            try:
                entries = parse_entries(self.key_file.read_text())
            except OSError as error:
                raise KeyConfigError(f"cannot read the {self.describe()}: {error.strerror or error}") from None
        elif self.secret_id:
            entries = parse_entries(self._secret_text(secrets_client))
        else:
            raise KeyConfigError("no API key source is configured")
        if not entries:
            raise KeyConfigError(f"the {self.describe()} holds no key")
        return entries

    def _secret_text(self, client: Any) -> str:
        if client is None:
            import boto3
            from botocore.config import Config

            # A re-read runs inside a request (ApiKeys._current), on the server's event loop: botocore's defaults
            # (60 s to connect, 60 s to read, retried) would stall every request for minutes while Secrets Manager
            # is unreachable; with these a failed re-read costs seconds, once per refresh period.
            bounded = Config(connect_timeout=2, read_timeout=3, retries={"max_attempts": 2, "mode": "standard"})
            client = boto3.client("secretsmanager", region_name=self.region, config=bounded)
        try:
            value = client.get_secret_value(SecretId=self.secret_id)
        except Exception as error:  # botocore's ClientError, a timeout, no credentials: all mean "cannot read it"
            raise KeyConfigError(f"cannot read the {self.describe()}: {type(error).__name__}: {error}") from None
        text = value.get("SecretString")
        if not isinstance(text, str):
            raise KeyConfigError(f"the {self.describe()} has no SecretString (binary secrets are not read)")
        return text


class ApiKeys:
    """The keys of one source, checked in constant time, re-read from a file or secret at most every `refresh_s`.

    `min_chars`: the shortest key the source may hold (the Batch API's 32): a shorter one refuses the start, and a
    re-read that brings one keeps the last keys that loaded, as any unreadable re-read does.
    """

    def __init__(
        self,
        source: KeySource,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        secrets_client: Any = None,
        min_chars: int = 1,
    ) -> None:
        self.source = source
        self._refresh_s = refresh_s
        self._clock = clock
        self._secrets_client = secrets_client
        self._min_chars = min_chars
        self._lock = threading.Lock()
        self._digests = self._load()  # raises KeyConfigError: a front never starts on a source it cannot read
        self._loaded_at = clock()
        self._warned = False

    def _load(self) -> dict[bytes, KeyEntry]:
        entries = self.source.entries(self._secrets_client)
        check_length(entries, self._min_chars, self.source.describe())
        return {hashlib.sha256(entry.key.encode()).digest(): entry for entry in entries}

    def _current(self) -> dict[bytes, KeyEntry]:
        if self.source.key or self._clock() - self._loaded_at < self._refresh_s:
            return self._digests
        with self._lock:
            if self._clock() - self._loaded_at >= self._refresh_s:
                try:
                    self._digests = self._load()
                    self._warned = False
                except KeyConfigError as error:
                    if not self._warned:
                        print(f"llm-batch: keeping the last API keys that loaded: {error}", file=sys.stderr)
                        self._warned = True
                self._loaded_at = self._clock()
        return self._digests

    def identify(self, presented: str | None) -> KeyEntry | None:
        """The entry of the key `presented` is, or None; every key is compared, each in constant time."""
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        found: KeyEntry | None = None
        for known, entry in self._current().items():
            if hmac.compare_digest(digest, known):
                found = entry
        return found

    def match(self, presented: str | None) -> str | None:
        """The `key_id` of the key `presented` is, or None."""
        entry = self.identify(presented)
        return None if entry is None else key_id(entry.key)

    def __len__(self) -> int:
        return len(self._current())


def bearer_key(authorization: str | None) -> str | None:
    """The key in an `Authorization: Bearer KEY` header value (what OpenAI's clients send), else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def openai_auth_error(presented: str | None) -> dict[str, Any]:
    """OpenAI's 401 body: `invalid_api_key` for a wrong key, and its own wording when none was sent."""
    if presented is None:
        message = (
            "You didn't provide an API key. You need to provide your API key in an Authorization header using "
            "Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
        return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    message = "Incorrect API key provided. Ask the endpoint's operator for a key (docs/security.md, API keys)."
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def is_loopback_host(host: str) -> bool:
    """A bind address that only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def keys_for_host(host: str, source: KeySource, front: str, min_chars: int = 1) -> ApiKeys | None:
    """The keys a front bound on `host` checks, or None (no key) where that is allowed: loopback only.

    Raises KeyConfigError in one line when a front reachable from other machines has no key source.
    """
    if not source.configured:
        if is_loopback_host(host):
            return None
        raise KeyConfigError(
            f"{front} binds {host}, reachable from other machines, and has no API key: set {ENV_KEY}, "
            f"{ENV_KEY_FILE} (one key per line) or {ENV_KEY_SECRET}, or bind 127.0.0.1"
        )
    return ApiKeys(source, min_chars=min_chars)


# Defined in entries.py and used by every front through this module.
__all__ = ["KEY_ID_CHARS", "ApiKeys", "KeyConfigError", "KeyEntry", "KeySource", "key_id", "parse_key_text"]
