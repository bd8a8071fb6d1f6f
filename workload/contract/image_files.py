"""A Batch API batch's uploaded images (issue 57), a mixin of InputConfig: the one way a batch's job reads images
from the store besides `data:` URLs.

Set by the Batch API's executor (workload/batch_api/executor.py), never by hand: the files a batch's lines name by
`file_id`, each checked at the batch's create to be a `vision` file of the batch's owner, mapped to where the job
reads it. The job resolves a `file_id` through this mapping only, so a line naming any other id (another tenant's,
a deleted one) reads nothing: it is that row's `invalid_image` error (docs/batch-api.md, "Images").
Apart from images.py (the prefix, counts and sizes) because only the Batch API sets it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

# Output-affecting, and later than the first outputs: left out of the output hash at its default (config.LATER_FIELDS).
IMAGE_FILE_FIELDS = frozenset({"image_files"})
# The Batch API's file ids (workload/batch_api/objects.py new_id): a key of the mapping is one, nothing else.
_FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")


class ImageFileSettings(BaseModel):
    """Mixed into InputConfig: its `model_config` (strict, frozen) applies."""

    image_files: dict[str, str] | None = Field(
        None,
        description="Set by the Batch API for a batch's job: each uploaded `vision` file a line names by "
        "`file_id` (checked at create to be the batch owner's), and where its image is (an s3:// URI or a local "
        "path). A `file_id` outside it is an `invalid_image` error row. None: no uploaded images.",
    )

    @field_validator("image_files")
    @classmethod
    def _ids_and_places(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for file_id, where in (value or {}).items():
            if not _FILE_ID.match(file_id):
                raise ValueError(f"input.image_files key {file_id!r} is not a file id (file-<24 hex>)")
            if not where.strip() or ("://" in where and not where.startswith("s3://")):
                raise ValueError(f"input.image_files[{file_id!r}] {where!r} must be an s3:// URI or a local path")
        return value
