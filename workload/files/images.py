"""A row's images (issue 57): where they sit in the messages, where they may be read from, how many.

Two ways in, one shape out:
- OpenAI chat content parts `{"type": "image_url", "image_url": {"url": ...}}` beside text parts; each becomes the
  template's `{"type": "image"}` part where it stood (the placeholder a VLM's chat template writes its image token
  for, as vLLM's server hands it), and its url joins the row's image list, in order;
- a native row's `images` column (a list of urls) with `messages`: the images go before the text of the last user
  message, the place captioning and extraction prompts put them.

A url is a `data:image/...;base64,` URL, a key under `input.image_prefix`, or (a Batch API batch's Responses line
naming an uploaded file by `file_id`) FILE_REF and an id of `input.image_files`, the mapping the Batch API checked
at create; nothing else, so no row can make a worker fetch from another host, read another prefix's objects or
another tenant's file. Only the count and the form are checked here, on
the validation stage; the bytes are fetched, bounded and decoded by the image stage on the workers
(workload/engine/image_stage.py), never on the driver.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from workload.contract.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES_PER_ROW

IMAGES_KEY = "images"
# The column a row's image urls ride on (JSON list) from validation to the image stage.
IMAGES_COLUMN = "_images"
# The key an OpenAI line's urls ride on in its row, already placed as image parts in its messages.
IMAGE_URLS_KEY = "_image_urls"
# A message's urls while openai_batch collects them (popped before the row is made).
URLS_FIELD = "_urls"
IMAGE_PART = {"type": "image"}
# How a Responses `input_image` part's `file_id` rides as an image url (workload/files/responses.py): resolved
# through `input.image_files` alone, never as a path or a key.
FILE_REF = "file_id:"
_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+)?(;[^,]*)?;base64,", re.IGNORECASE)


class ImageRefused(ValueError):
    """A row's image that cannot be taken: `error_type` is the error row's type, `field` the offending field."""

    def __init__(self, error_type: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.error_type, self.message, self.field = error_type, message, field


@dataclass(frozen=True)
class ImageRules:
    """The input's image settings (workload/contract/images.py), as the validation and image stages read them."""

    prefix: str | None
    max_images: int
    max_bytes: int
    files: Mapping[str, str] = field(default_factory=dict)  # input.image_files: file id -> where its image is

    DEFAULT: ClassVar[ImageRules]

    @classmethod
    def of(cls, settings: Any) -> ImageRules:
        files = settings.image_files or {}
        return cls(settings.image_prefix, settings.max_images_per_row, settings.max_image_bytes, files)

    def file_uri(self, url: str) -> str | None:
        """Where a FILE_REF url's uploaded image is; None: not a FILE_REF url, or an id the batch was not given."""
        return self.files.get(url[len(FILE_REF) :]) if url.startswith(FILE_REF) else None


# InputConfig's defaults (workload/contract/images.py): data: URLs only.
ImageRules.DEFAULT = ImageRules(None, DEFAULT_MAX_IMAGES_PER_ROW, DEFAULT_MAX_IMAGE_BYTES)


def content_parts(content: list[Any], where: str) -> tuple[list[dict[str, Any]] | str, list[str]]:
    """An OpenAI content array as the template gets it, and its image urls in order. Text only: the joined text
    (as before images existed, so a text row renders as it did). Raises ImageRefused naming a bad part."""
    parts: list[dict[str, Any]] = []
    urls: list[str] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = _part_url(part.get("image_url"), f"{where}[{index}]")
            parts.append(dict(IMAGE_PART))
            urls.append(url)
        else:
            message = f"{where}[{index}] is a {kind!r} part; only text and image_url parts are supported"
            raise ImageRefused("invalid_request", message, where)
    if not urls:
        return "".join(p["text"] for p in parts), []
    return parts, urls


def _part_url(value: Any, where: str) -> str:
    # OpenAI's `detail` (low/high/auto) picks tiles on its own models; the engine's processor decides here.
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) or set(value) - {"url", "detail"}:
        raise ImageRefused("invalid_image", f"{where}.image_url must be an object with a string 'url'", where)
    return str(value["url"])


def with_row_images(messages: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """A native row's messages with its `count` images placed before the last user message's text."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise ImageRefused("invalid_image", "a row's images need a user message to go with", IMAGES_KEY)
    last = users[-1]
    text = messages[last]["content"]
    placed = {**messages[last], "content": [dict(IMAGE_PART)] * count + [{"type": "text", "text": text}]}
    return [*messages[:last], placed, *messages[last + 1 :]]


def as_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An image row's messages with every plain string content as one text part: VLM templates that loop over
    parts (SmolVLM's) would drop a string's text silently, and the ones that take both (Qwen2.5-VL's) read parts
    the same. Tool-call turns keep their own shape (workload/files/tools.py)."""
    plain = ("system", "user", "assistant")
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}]}
        if isinstance(m.get("content"), str) and m["role"] in plain and not m.get("tool_calls")
        else m
        for m in messages
    ]


def row_images(value: Any) -> list[str]:
    """A native row's `images` column: a list of url strings."""
    if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
        raise ImageRefused("invalid_image", "'images' must be a list of url strings", IMAGES_KEY)
    return list(value)


def check_urls(urls: list[str], rules: ImageRules) -> None:
    """The count and each url's form; a data: URL's size too (its bytes are already in the row)."""
    if len(urls) > rules.max_images:
        message = f"row has {len(urls)} images, more than input.max_images_per_row={rules.max_images}"
        raise ImageRefused("too_many_images", message, IMAGES_KEY)
    for index, url in enumerate(urls):
        check_url(url, rules, f"image {index}")


def check_url(url: str, rules: ImageRules, where: str) -> None:
    if url.startswith("data:"):
        found = _DATA_URL.match(url)
        if found is None:
            raise ImageRefused("invalid_image", f"{where}: a data: URL must be data:image/<type>;base64,<data>")
        # 3 bytes per 4 base64 characters: bounded before anything is decoded.
        if (len(url) - found.end()) * 3 // 4 > rules.max_bytes + 2:
            raise ImageRefused("image_too_large", f"{where} is larger than input.max_image_bytes={rules.max_bytes}")
        return
    if url.startswith(FILE_REF):
        if rules.file_uri(url) is None:
            message = (
                f"{where}: file_id {url[len(FILE_REF) :]!r} is not a vision file checked for this batch; uploaded "
                "files are named only through the Batch API, each one the batch owner's own"
            )
            raise ImageRefused("invalid_image", message)
        return
    if rules.prefix is not None and url.startswith(rules.prefix) and ".." not in url[len(rules.prefix) :].split("/"):
        return
    where_from = f"or a key under input.image_prefix {rules.prefix!r}" if rules.prefix else "(input.image_prefix unset)"
    raise ImageRefused("invalid_image", f"{where}: {_shown(url)!r} is not a data: URL {where_from}; no other hosts")


def decode_data_url(url: str, rules: ImageRules, where: str) -> bytes:
    found = _DATA_URL.match(url)
    if found is None:
        raise ImageRefused("invalid_image", f"{where}: a data: URL must be data:image/<type>;base64,<data>")
    try:
        data = base64.b64decode(url[found.end() :], validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImageRefused("invalid_image", f"{where}: bad base64 in the data: URL ({error})") from None
    if len(data) > rules.max_bytes:
        message = f"{where} is {len(data)} bytes, over input.max_image_bytes={rules.max_bytes}"
        raise ImageRefused("image_too_large", message)
    return data


def _shown(url: str) -> str:
    return url if len(url) <= 80 else url[:77] + "..."
