"""The image stage (issue 57): a row's images fetched, bounded and decoded on the CPU stages' workers, then handed
to the engine as vLLM's `multi_modal_data`; never on the driver.

Where it runs: inside the chat-template actor (workload/engine/pipeline.py, `ApplyChatTemplate`), which every
chat row passes and which already holds the model's folder: an image row is always a chat row (its images are
parts of its messages), and a stage of its own would cost one more actor start and its memory for nothing.

What the engine gets: the verified image bytes (column IMAGE_BYTES_COLUMN), opened as PIL images in the engine
actor (`multimodal_data`). The engine's own processor (vLLM's, the model's Hugging Face processor: resize, tiles,
the image tokens in the prompt) turns them into pixels and tokens, so the prompt the row is charged for is the
one the model saw. The bytes, not decoded pixels, cross Ray's object store: a photo's JPEG is a tenth of its
pixels or less. Ray Data LLM's own `PrepareMultimodalStage` is not used: it fetches urls with vLLM's media
connector, which reaches any http host, and the job must read only `data:` URLs and the configured prefix.

Errors, each its row's error (never the run's): `images_not_supported` (the served model has no vision tower),
`image_too_large` (over input.max_image_bytes, checked before an object is read: a prefix key or a Batch API
upload's file, read where input.image_files maps its id), `invalid_image` (not an image
PIL can decode whole, or a decompression bomb), and a failed read of the object.
"""

from __future__ import annotations

import io
import json
from typing import Any

from workload.contract.images import unreadable_image
from workload.files.images import ImageRefused, ImageRules, check_url, decode_data_url
from workload.files.results import IMAGE_ERROR_PREFIX
from workload.files.storage import StorageError, locate, read_bytes, size_of

# The verified bytes of a row's images, in order (list<binary>), from this stage to the engine.
IMAGE_BYTES_COLUMN = "_image_bytes"


def has_vision(model_folder: str) -> bool:
    """Whether the model reads images: its config names a vision tower (Idefics3, Qwen2.5-VL, LLaVA, ... all do)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_folder)
    return getattr(config, "vision_config", None) is not None


def error_text(refused: ImageRefused) -> str:
    """The row's error as the pipeline's error column carries it (workload/files/results.py reads it back)."""
    return f"{IMAGE_ERROR_PREFIX}{refused.error_type}: {refused.message}"


class ImageFetcher:
    """One per chat-template actor: fetches and checks a row's images."""

    def __init__(self, model_folder: str, rules: ImageRules) -> None:
        self.rules = rules
        self.vision = has_vision(model_folder)

    def fetch(self, urls_json: str) -> list[bytes]:
        """The row's images as verified bytes; raises ImageRefused naming the first bad one."""
        if not self.vision:
            raise ImageRefused("images_not_supported", "the served model reads text only; it cannot take images")
        urls = json.loads(urls_json)
        return [self._one(url, f"image {index}") for index, url in enumerate(urls)]

    def _one(self, url: str, where: str) -> bytes:
        check_url(url, self.rules, where)  # validation checked it too: this stage trusts no column
        if url.startswith("data:"):
            data = decode_data_url(url, self.rules, where)
        else:  # a key under the prefix, or an uploaded file through the batch's checked mapping (check_url)
            data = self._read(self.rules.file_uri(url) or url, where)
        verify(data, where)
        return data

    def _read(self, url: str, where: str) -> bytes:
        location = locate(url)
        try:
            size = size_of(location)
            if size > self.rules.max_bytes:
                message = f"{where} is {size} bytes, over input.max_image_bytes={self.rules.max_bytes}"
                raise ImageRefused("image_too_large", message)
            return read_bytes(location)
        except (StorageError, OSError) as error:
            raise ImageRefused("invalid_image", f"{where}: cannot read {url}: {error}") from None


def verify(data: bytes, where: str) -> None:
    """Decode the image whole: a truncated or corrupt file, or a decompression bomb, fails here, as its row."""
    problem = unreadable_image(data)
    if problem is not None:
        raise ImageRefused("invalid_image", f"{where} is not a readable image ({problem})")


def with_images(row: dict[str, Any]) -> None:
    """The engine's row with its images as Ray Data LLM's `multimodal_data` (vLLM's `multi_modal_data`).

    An image row goes to the engine as text, its tokens dropped where the tokenize stage made them: the engine's
    processor then expands each image placeholder into the image's tokens as the model's own processor does,
    which token ids (placeholder already tokenized) leave to vLLM's search in token space."""
    data = multimodal_data(row.pop(IMAGE_BYTES_COLUMN, None))
    if data is not None:
        row["multimodal_data"] = data
        row.pop("tokenized_prompt", None)


def multimodal_data(images: Any) -> dict[str, Any] | None:
    """vLLM's `multi_modal_data` for a row's verified bytes (None: a text row), opened in the engine actor."""
    if images is None or len(images) == 0:
        return None
    from PIL import Image

    return {"image": [Image.open(io.BytesIO(bytes(data))).convert("RGB") for data in images]}
