"""The input's image settings (issue 57), a mixin of InputConfig: where images may come from and how large.

Apart from workload/contract/config.py so the image path is one concern: the reader (workload/files/images.py)
and the image stage (workload/engine/image_stage.py) read these fields, nothing else does.
"""

from __future__ import annotations

import io
import warnings

from pydantic import BaseModel, Field, field_validator

# An image's bytes travel in Ray's object store beside its row until the engine reads them: a bound keeps one row
# from filling a worker's memory, as max_record_bytes bounds a line.
DEFAULT_MAX_IMAGE_BYTES = 8 << 20
DEFAULT_MAX_IMAGES_PER_ROW = 4
# Output-affecting, and later than the first outputs: left out of the output hash at their defaults
# (config.LATER_FIELDS), so a night begun before images existed still resumes.
IMAGE_FIELDS = frozenset({"image_prefix", "max_images_per_row", "max_image_bytes"})


class ImageInputSettings(BaseModel):
    """Mixed into InputConfig: its `model_config` (strict, frozen) applies."""

    image_prefix: str | None = Field(
        None,
        description="The one place a row's image may be read from besides a `data:` URL: an s3://bucket/prefix/ "
        "(or a local folder, for local runs). An image url outside it is an `invalid_image` error row; no other "
        "host is ever fetched. None: `data:` URLs only.",
    )
    max_images_per_row: int = Field(
        DEFAULT_MAX_IMAGES_PER_ROW,
        ge=1,
        le=64,
        description="Most images one row may carry (its messages' image_url parts, or its `images` column). More "
        "is a `too_many_images` error row. The engine reserves room for this many per prompt.",
    )
    max_image_bytes: int = Field(
        DEFAULT_MAX_IMAGE_BYTES,
        ge=1024,
        le=64 << 20,
        description="Largest image, as encoded (a data: URL's decoded bytes or the object's size). A larger one "
        "is an `image_too_large` error row, never fetched whole.",
    )

    @field_validator("image_prefix")
    @classmethod
    def _a_folder(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "://" in value and not value.startswith("s3://"):
            raise ValueError(f"input.image_prefix {value!r} must be an s3:// prefix or a local folder (no other hosts)")
        if value.startswith("s3://") and len(value.removeprefix("s3://").strip("/")) == 0:
            raise ValueError("input.image_prefix names no bucket")
        # A prefix without its trailing slash would also take keys of a sibling (s3://b/img matches s3://b/img2/).
        return value if value.endswith("/") else value + "/"


def unreadable_image(data: bytes) -> str | None:
    """Why `data` is not an image Pillow decodes whole (truncated, corrupt, not an image, a decompression bomb), or
    None. The Batch API's vision uploads and the job's image stage judge an image by this one rule."""
    from PIL import Image  # imported here: the config (and infra, which reads it) needs no Pillow

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                image.load()
    except Exception as error:  # PIL raises many kinds (UnidentifiedImageError, OSError, SyntaxError, ...)
        return f"{type(error).__name__}: {error}"
    return None
