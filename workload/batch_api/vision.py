"""Images uploaded as files of their own (issue 57): OpenAI's `vision` purpose, and the `file_id`s a batch's lines
name, checked at the batch's create.

An upload of purpose `vision` is kept only if it is an image Pillow decodes whole, within the server's
`Limits.max_image_bytes` (the job's input.max_image_bytes): a bad one is refused at the upload, not found by the
job. A batch's line names one from a Responses `input_image` part (`{"type": "input_image", "file_id": ...}`, the
official client's ResponseInputImageParam); OpenAI's chat `image_url` part has no file id. At create every such
id must be a `vision` file its owner sees (tenants.py `sees`), or the batch fails there, naming the line and the
param. The ids that pass, with their store keys, are the batch's `_image_files`: the executor hands the job
exactly those (input.image_files; on the tiers, its member's `image_files` in the run's pool spec, pools.py),
and the job resolves a file id through that mapping alone, so no line can make it read another tenant's object
(docs/batch-api.md, "Images").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from workload.batch_api.models import FileRecord
from workload.batch_api.objects import ApiError
from workload.batch_api.tenants import sees
from workload.contract.images import unreadable_image

VISION = "vision"
_MARK = b'"file_id"'  # a line without it names no file: not parsed a second time at create


def check_size(size: int, most: int | None, param: str = "file") -> None:
    """A vision file's size against the server's bound; `most` None: this front serves no vision files."""
    if most is None:
        raise ApiError(400, "purpose 'vision' is not served by this front; give images as data: URLs", "purpose")
    if size > most:
        raise ApiError(400, f"the image is {size} bytes, over this server's max_image_bytes of {most}", param)


def capped(chunks: Iterator[bytes] | Any, most: int) -> Iterator[bytes]:
    """The upload's chunks, refused as they stream once past `most` bytes (nothing larger is stored)."""
    size = 0
    for chunk in chunks:
        size += len(chunk)
        check_size(size, most)
        yield chunk


def check_image(body: Iterator[bytes]) -> None:
    """The stored bytes decode whole as an image (the job's image stage decodes them again, on its workers)."""
    # Pillow comes with the AWS front's bundle too (requirements/lambda.lock); a file completed from an Upload's
    # parts is checked here whole, as one sent in one request.
    problem = unreadable_image(b"".join(body))
    if problem is not None:
        raise ApiError(400, f"a 'vision' file must be an image Pillow reads whole ({problem})", "file")


def line_refs(line: bytes) -> list[tuple[str, str]]:
    """The (file_id, param) of every `input_image` part with a `file_id` in one Responses line, in order."""
    if _MARK not in line:
        return []
    try:
        value = json.loads(line)
    except ValueError:
        return []  # not JSON: the job's error line (the create's own check reports it where it must)
    found: list[tuple[str, str]] = []
    _walk(value, "", found)
    return found


def _walk(value: Any, where: str, found: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        if value.get("type") == "input_image" and "file_id" in value:
            found.append((value["file_id"], f"{where}.file_id".lstrip(".")))
        for key, inner in value.items():
            _walk(inner, f"{where}.{key}", found)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            _walk(inner, f"{where}[{index}]", found)


def resolve(
    refs: list[tuple[int, str, str]], owner: str, lookup: Callable[[str], FileRecord | None]
) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The store key of each file id named (line, file_id, param), or the first problem as a batch error: an id
    that is not a `vision` file `owner` sees answers as an unknown one (no probing of other tenants' ids)."""
    keys: dict[str, str] = {}
    for line, file_id, param in refs:
        if isinstance(file_id, str) and file_id in keys:
            continue
        record = _lookup(lookup, file_id)
        if record is None or not sees(owner, record.owner):
            message = f"no vision file {file_id!r} of yours: a line's input_image names only your own uploads"
            return {}, {"code": "invalid_file_id", "message": message, "line": line, "param": param}
        if record.purpose != VISION:
            message = f"file {file_id} has purpose {record.purpose!r}; an input_image file_id needs 'vision'"
            return {}, {"code": "invalid_file_id", "message": message, "line": line, "param": param}
        keys[file_id] = record.key
    return keys, None


def _lookup(lookup: Callable[[str], FileRecord | None], file_id: Any) -> FileRecord | None:
    if not isinstance(file_id, str) or not file_id.startswith("file-"):
        return None
    try:
        return lookup(file_id)
    except ValueError:  # not an id the store takes
        return None
