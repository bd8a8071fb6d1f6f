"""What a secret looks like: by its shape (the value) and by the name it is filed under (the key).

Pure functions over values and text, no plan reading: `infra.rules.checks_credentials` decides where to look.
A finding names what was found and where, never the value itself, so a report can be printed and kept.

By shape (anywhere, whatever the key): AWS access key ids (`AKIA...` long-term, `ASIA...` temporary), AWS
secret access keys (40 characters of base64 with upper case, lower case and digits), Hugging Face tokens
(`hf_` and 30 or more letters and digits), PEM private keys (`-----BEGIN ... PRIVATE KEY-----`).

By name: a key whose words include secret, token, password, passphrase, credential, or private/api/access/secret
key (`HF_TOKEN`, `hubToken`, `db-password`, `AWS_SECRET_ACCESS_KEY`) may hold only a *reference* to a secret: an
ARN, an absolute file path, a URL without credentials, a variable, JSONPath or template expression, the name of
a secret of the plan, a number or boolean, or nothing. A literal under such a name is a secret written in clear,
and so is a Pulumi secret (masked in the plan as `[secret]`): it is still stored in clear in the resource's
configuration, readable by anyone who may describe the resource. Plural `tokens` is a count (max_tokens), not a
credential, and `tokenizer` is a model part: word matching, not substring matching, keeps both out.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import itertools
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infra.rules.plan_view import SECRET_MASK

SHAPES: dict[str, re.Pattern[str]] = {
    "an AWS access key id": re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
    # 40 base64 characters standing alone; `_looks_random` then asks for upper case, lower case and digits.
    "an AWS secret access key": re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"),
    "a Hugging Face token": re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}"),
    "a PEM private key": re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
}
SECRET_WORDS = frozenset(
    {"secret", "secrets", "token", "password", "passwd", "passphrase", "credential", "credentials"}
)
SECRET_PAIRS = frozenset({("private", "key"), ("api", "key"), ("access", "key"), ("secret", "key")})
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_REFERENCE = re.compile(
    r"""^(?:arn:|/\S*$|~/|\$|\{\{|States\.|(?:https?|s3|file)://[^/@\s]*(?:/\S*)?$|(?:true|false|null|none)$|-?[0-9.]+$)""",
    re.IGNORECASE,
)
# `NAME=value`, `export NAME=value`, `name: value`, `"name": "value"` in a script, config file or document.
_ASSIGNMENT = re.compile(
    r"""(?:^|[\s;{(,"'])(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)["']?[ \t]*(?:=|:[ \t])[ \t]*"""
    r"""(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s"',;}#]*)""",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Finding:
    where: str  # a path into the resource: `inputs.environment.variables.HF_TOKEN`
    what: str  # "a Hugging Face token", "a literal under a secret's name", ...

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def is_secret_name(key: str) -> bool:
    """Whether a key names a secret (`HF_TOKEN`, `hubToken`, `db-password`), by its words."""
    words = [word.lower() for word in _WORD.findall(key)]
    return bool(SECRET_WORDS.intersection(words)) or any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def is_reference(value: Any, secret_names: Collection[str] = ()) -> bool:
    """Whether a value under a secret's name only points at the secret (ARN, path, variable, ...), or is empty."""
    if value is None or isinstance(value, bool | int | float):
        return True
    text = str(value).strip().strip("\"'")
    if text == SECRET_MASK:
        return False
    return text == "" or text in secret_names or bool(_REFERENCE.match(text))


def _looks_random(candidate: str) -> bool:
    # A path or a word run of 40 characters is not a key: a key mixes cases and digits and is no path.
    return (
        not candidate.startswith("/")
        and any(c.isupper() for c in candidate)
        and any(c.islower() for c in candidate)
        and any(c.isdigit() for c in candidate)
    )


def shapes_in(text: str) -> list[str]:
    """What secret-shaped things a text holds (the kinds, never the values)."""
    found = []
    for what, pattern in SHAPES.items():
        matches = pattern.findall(text)
        if what == "an AWS secret access key":
            matches = [match for match in matches if _looks_random(match)]
        if matches:
            found.append(what)
    return found


def decoded(value: str) -> str | None:
    """A base64 value (user data, a ConfigMap's binaryData) as text, gunzipped when gzip; None when not base64."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return None
    return raw.decode("utf-8", errors="replace")


def strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(path, string) for every string inside a value, keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{where}.{key}", str(key)
            yield from strings(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from strings(item, f"{where}[{index}]")


def shape_findings(value: Any, where: str) -> list[Finding]:
    """A finding for each string inside `value` that holds something secret-shaped."""
    return [Finding(path, what) for path, text in strings(value, where) for what in shapes_in(text)]


def named_findings(value: Any, where: str, secret_names: Collection[str] = ()) -> list[Finding]:
    """A finding for each key of a structure (at any depth) that names a secret but holds a literal."""
    findings: list[Finding] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = f"{where}.{key}"
            if str(key).endswith(".$"):
                continue  # Step Functions: the value is a JSONPath or an intrinsic, never a literal
            scalar = not isinstance(item, Mapping | list)
            if is_secret_name(str(key)) and scalar and not is_reference(item, secret_names):
                findings.append(Finding(path, literal_problem(item)))
            findings += named_findings(item, path, secret_names)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            findings += named_findings(item, f"{where}[{index}]", secret_names)
    return findings


def env_findings(env: Any, where: str, secret_names: Collection[str] = ()) -> list[Finding]:
    """Kubernetes or ECS `env` lists ({name, value}): a secret's name with a literal value (valueFrom is fine)."""
    findings = []
    for index, entry in enumerate(env if isinstance(env, list) else []):
        if not isinstance(entry, Mapping) or "value" not in entry:
            continue
        name = str(entry.get("name", ""))
        if is_secret_name(name) and not is_reference(entry["value"], secret_names):
            findings.append(Finding(f"{where}[{index}] ({name})", literal_problem(entry["value"])))
    return findings


def text_findings(text: str, where: str, secret_names: Collection[str] = ()) -> list[Finding]:
    """Secret shapes in a script or file, and assignments (`NAME=...`, `name: ...`) of a literal to a secret's name."""
    findings = [Finding(where, what) for what in shapes_in(text)]
    for match in _ASSIGNMENT.finditer(text):
        key, value = match.group("key"), match.group("value")
        if is_secret_name(key) and not is_reference(value, secret_names):
            findings.append(Finding(f"{where} ({key})", literal_problem(value)))
    return findings


def literal_problem(value: Any) -> str:
    if str(value).strip().strip("\"'") == SECRET_MASK:
        return "a Pulumi secret, stored in clear in the resource's configuration"
    return "a literal under a secret's name (only a reference belongs there: an ARN, a file path, a variable)"
