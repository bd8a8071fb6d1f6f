"""The nightly run's Step Functions definitions: data files with `${Placeholder}` substitutions.

The files are plain JSON so tests read them directly. `render` fills them the way CloudFormation's
DefinitionSubstitutions would, with one difference that keeps the files valid JSON: a string that is
exactly `"${Name}"` takes the substitution's own JSON type (so `"Seconds": "${PollSeconds}"` becomes a
number), while a placeholder inside a longer string is replaced by its text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DEFINITIONS_DIR = Path(__file__).resolve().parent

#: The nightly run for each kind of capacity, and the periodic sweep that releases it when no run is going.
NIGHTLY = {"asg": "small.asl.json", "eks": "eks.asl.json"}
SWEEP = {"asg": "sweep_small.asl.json", "eks": "sweep_eks.asl.json"}

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z][A-Za-z0-9]*)\}")
_WHOLE = re.compile(r"^\$\{([A-Za-z][A-Za-z0-9]*)\}$")

Substitution = str | int | float | bool


def load(file_name: str) -> dict[str, Any]:
    """The raw definition (placeholders not filled)."""
    path = DEFINITIONS_DIR / file_name
    if not path.is_file():
        raise FileNotFoundError(f"no state machine definition {file_name!r} in {DEFINITIONS_DIR}")
    definition: dict[str, Any] = json.loads(path.read_text())
    return definition


def placeholders(definition: Any) -> set[str]:
    """Every `${Name}` the definition uses."""
    return set(_PLACEHOLDER.findall(json.dumps(definition)))


def render(file_name: str, substitutions: dict[str, Substitution]) -> dict[str, Any]:
    """The definition with every placeholder filled; refuses missing and unused substitutions."""
    definition = load(file_name)
    wanted = placeholders(definition)
    missing = sorted(wanted - substitutions.keys())
    if missing:
        raise ValueError(f"{file_name}: no value for placeholder(s) {', '.join(missing)}")
    unused = sorted(substitutions.keys() - wanted)
    if unused:
        raise ValueError(f"{file_name}: substitution(s) {', '.join(unused)} are not used by the definition")
    for name, value in substitutions.items():
        if isinstance(value, str) and "'" in value:
            # Values also land inside intrinsic-function literals ('...'), where a quote would end them.
            raise ValueError(f"{file_name}: substitution {name}={value!r} contains a single quote")
    rendered: dict[str, Any] = _fill(definition, substitutions)
    return rendered


def render_json(file_name: str, substitutions: dict[str, Substitution]) -> str:
    """`render` as the JSON text a state machine resource takes."""
    return json.dumps(render(file_name, substitutions), indent=2, sort_keys=False)


def _fill(node: Any, subs: dict[str, Substitution]) -> Any:
    if isinstance(node, dict):
        return {key: _fill(value, subs) for key, value in node.items()}
    if isinstance(node, list):
        return [_fill(item, subs) for item in node]
    if isinstance(node, str):
        whole = _WHOLE.match(node)
        if whole:
            return subs[whole.group(1)]
        return _PLACEHOLDER.sub(lambda match: str(subs[match.group(1)]), node)
    return node


def format_template(prefix: str, key: str = "prefix") -> str:
    """A `{date}` prefix template (e.g. `input/{date}/`) as the `States.Format` template the definitions use.

    Exactly one `{date}` is required: without it every night would share one output and resume would
    skip the whole new night as already done.
    """
    if prefix.count("{date}") != 1:
        raise ValueError(f"{key} {prefix!r} must contain {{date}} exactly once")
    rest = prefix.replace("{date}", "")
    if any(char in rest for char in "{}'\\"):
        raise ValueError(f"{key} {prefix!r} may not contain braces, quotes or backslashes besides {{date}}")
    if prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"{key} {prefix!r} must be a relative S3 prefix ending in '/'")
    return prefix.replace("{date}", "{}")
