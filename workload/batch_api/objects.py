"""OpenAI's shapes and limits as this API serves them: its error body, ids, pages, a batch's errors and GPU share,
and the limits the server enforces.

The records themselves (OpenAI's objects plus the private fields that never leave the server) are typed in
models.py. The shapes follow the official client's types (openai.types.FileObject, Batch, BatchRequestCounts,
BatchError, FileDeleted).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

# What this API stores: inputs it runs, the outputs it writes, and images a batch's lines name (OpenAI's `vision`).
FILE_PURPOSES = ("batch", "batch_output", "vision")
UPLOAD_PURPOSES = ("batch", "vision")  # what a client may upload (the others of OpenAI's are for features not served)
COMPLETION_WINDOWS = {"24h": 24 * 3600}  # OpenAI's only window
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
ACTIVE = frozenset({"in_progress", "finalizing", "cancelling"})  # a job runs (or is being stopped) for the batch

# OpenAI's documented limits (openai.types.batch_create_params: "up to 50,000 requests, and can be up to 200 MB");
# metadata: 16 pairs, keys up to 64 characters, values up to 512 (openai.types.shared.Metadata).
OPENAI_MAX_FILE_BYTES = 200 * 1000 * 1000
OPENAI_MAX_REQUESTS = 50_000
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
# OpenAI's default for batch files ("files with purpose=batch expire after 30 days"), and the range it accepts.
DEFAULT_RETENTION_S = 30 * 24 * 3600
EXPIRES_AFTER_RANGE_S = (3600, 30 * 24 * 3600)


# The one field a Batch carries beyond OpenAI's (docs/batch-api.md, "Per-batch status, cost and alarms"): the
# official client's `openai.types.Batch` keeps unknown fields (its model allows extras: `batch.llm_batch`).
SIDE_FIELD = "llm_batch"
AT_RISK = "at_risk"  # its report while open, of a batch that would miss its window (at_risk.py)
GPU_SHARE_BASIS = "job: its attempts' wall time on the run's GPU nodes x their price per hour (summary.json)"


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = OPENAI_MAX_FILE_BYTES
    max_requests: int = OPENAI_MAX_REQUESTS
    retention_s: int = DEFAULT_RETENTION_S  # files (inputs and outputs) and a batch's job output are kept this long
    # A download larger than this is answered with a redirect to the store's presigned URL, where the store has
    # one (S3Store): the Lambda front answers at most 6 MB. None: always answered inline (the local server).
    inline_download_bytes: int | None = None
    # The largest `vision` file (the job's input.max_image_bytes, which its image stage applies again). None: this
    # front serves no vision files (the AWS front's function without LLM_BATCH_MAX_IMAGE_BYTES: lambda_front.py).
    max_image_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.inline_download_bytes is not None and self.inline_download_bytes < 0:
            raise ValueError(f"inline_download_bytes must be at least 0, got {self.inline_download_bytes}")
        if self.max_image_bytes is not None and self.max_image_bytes < 1:
            raise ValueError(f"max_image_bytes must be at least 1, got {self.max_image_bytes}")
        for name in ("max_file_bytes", "max_requests", "retention_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class ApiError(Exception):
    """A request refused, as OpenAI refuses it: HTTP status and `{"error": {message, type, param, code}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.error_type = status, message, param, code, error_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


def not_found(kind: str, object_id: str, param: str = "id") -> ApiError:
    """OpenAI's wording for an id that is unknown (or another tenant's: the same answer, so ids cannot be probed)."""
    return ApiError(404, f"No such {kind} object: {object_id}", param=param)


def new_id(kind: str) -> str:
    """OpenAI's id shapes (`file-...`, `batch_...`, `upload_...`, `part_...`): 24 random hex characters
    (unguessable: 96 bits)."""
    prefix = {"file": "file-", "batch": "batch_", "upload": "upload_", "part": "part_"}[kind]
    return prefix + secrets.token_hex(12)


def gpu_share(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A finished batch's share of the GPUs, from its job's summary.json (workload/job/summary.py): the job's own
    time on the nodes and what it cost at the stack's price per hour (0 where none is configured, as locally).
    Not in it: the boot (nodes, image, model) of the execution it ran in, which `python -m infra.status` shows
    per execution. None when the job wrote no summary (it never ran, or failed before its end)."""
    if summary is None:
        return None
    return {
        "job_wall_s": round(float(summary.get("wall_s") or 0.0), 3),
        "cost_usd": round(float(summary.get("cost_usd") or 0.0), 4),
        "basis": GPU_SHARE_BASIS,
    }


def batch_errors(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `errors` of a batch that failed validation: a list object of BatchError (code, line, message, param)."""
    return {"object": "list", "data": [{"line": None, "param": None, **error} for error in errors]}


def list_page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page (the SDK's SyncCursorPage reads `data` and `has_more`, and pages by the last id)."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }
