"""The workload image's build context and its content tag, computed the way Docker sees the context.

The tag is a hash of every file the builder receives (the repo root filtered by `.dockerignore`, with
Docker's matching rules), the Dockerfile and the build arguments. Equal inputs give an equal tag on any
machine, so with ECR's immutable tags an image reference names one build forever, and a change to anything
the image copies gives a new reference that every tier picks up on the next `pulumi up`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

TAG_PREFIX = "ctx-"
TAG_HEX_CHARS = 24  # 96 bits: collisions are out of reach, and the tag stays readable in a console


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    regex: re.Pattern[str]
    include: bool  # a `!` rule puts matching paths back into the context


def _translate(pattern: str) -> str:
    """A .dockerignore pattern as a regex (Go's filepath.Match syntax plus `**`, as moby's patternmatcher)."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                raise ValueError(f".dockerignore pattern {pattern!r}: unclosed '['")
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body[:1] in "!^" else body) + "]")
            i = end + 1
        elif char == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(char))
            i += 1
    return "^" + "".join(out) + "$"


def parse_dockerignore(text: str) -> list[IgnoreRule]:
    """The rules of a .dockerignore file, in order (later rules win, as in Docker)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line[1:].strip() if include else line
        cleaned = os.path.normpath(pattern).lstrip("/")
        if cleaned in ("", "."):
            raise ValueError(f".dockerignore line {raw!r} names no path")
        rules.append(IgnoreRule(pattern=cleaned, regex=re.compile(_translate(cleaned)), include=include))
    return rules


def is_ignored(path: str, rules: list[IgnoreRule]) -> bool:
    """Whether Docker leaves `path` (relative, '/'-separated) out of the context: the last rule matching the
    path or one of its parent folders decides."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for rule in rules:
        if any(rule.regex.match(candidate) for candidate in candidates):
            ignored = not rule.include
    return ignored


def _join(base: str, name: str) -> str:
    return name if base == "." else f"{base}/{name}"


def _may_reinclude(folder: str, rules: list[IgnoreRule]) -> bool:
    """Whether an include rule could match something inside `folder` (a wildcard one always might)."""
    return any(
        rule.include and (rule.pattern.startswith(folder + "/") or any(c in rule.pattern for c in "*?["))
        for rule in rules
    )


def ignore_file(root: Path, dockerfile: Path | None = None) -> Path | None:
    """The ignore file Docker applies: `<Dockerfile>.dockerignore` if present, else the context's own."""
    candidates = [dockerfile.with_name(dockerfile.name + ".dockerignore")] if dockerfile else []
    candidates.append(root / ".dockerignore")
    return next((path for path in candidates if path.is_file()), None)


def context_files(root: Path, dockerfile: Path | None = None) -> list[str]:
    """Every file the builder receives from `root`, as sorted '/'-separated relative paths."""
    ignore = ignore_file(root, dockerfile)
    rules = parse_dockerignore(ignore.read_text()) if ignore else []
    files = []
    for folder, dirnames, filenames in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        # Don't descend into an ignored folder no `!` rule can reach into (.git, .venv, node_modules, ...).
        dirnames[:] = [
            name
            for name in dirnames
            if not is_ignored(_join(base, name), rules) or _may_reinclude(_join(base, name), rules)
        ]
        for filename in filenames:
            relative = (Path(folder) / filename).relative_to(root).as_posix()
            if not is_ignored(relative, rules):
                files.append(relative)
    return sorted(files)


def content_tag(root: Path, dockerfile: Path, build_args: Mapping[str, str], platform: str) -> str:
    """The image tag for this exact build: same inputs, same tag; any changed input, a new tag."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("dockerfile", dockerfile.read_bytes())
    add("platform", platform.encode())
    for key in sorted(build_args):
        add(f"arg:{key}", build_args[key].encode())
    for relative in context_files(root, dockerfile):
        path = root / relative
        # Permission bits too: docker-build's own context hash covers them, and it must never decide to rebuild
        # (and push a new digest) under a tag this hash says is unchanged; ECR would refuse the immutable tag.
        add(f"file:{relative}:{stat.S_IMODE(path.stat().st_mode):o}", path.read_bytes())
    return TAG_PREFIX + digest.hexdigest()[:TAG_HEX_CHARS]
