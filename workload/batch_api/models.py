"""The Batch API's records as types: a File, a Batch, an Upload and a night's queue entry, as the store keeps them.

A record is OpenAI's object (the fields its official client reads, under their names) plus private fields that
never leave the server: who owns it, its order among records of the same second, where its body or its job's
output lives. Stored, a private field's name starts with an underscore (`_owner`, `_seq`, `_stop`, ...); here it
is an ordinary attribute (`owner`, `seq`, `stop`) whose alias is the stored name, so the JSON in the store is
the JSON the untyped code wrote (tests/workload/test_batch_api_records.py loads records it wrote, local and S3,
and writes them back unchanged). `public()` is the object a route answers: the stored fields without the
private ones, so no response can carry one.

Fields a record gains only late (a batch's `_done_at` and `_output_deleted`, a night's `started_at`) are left
out of the stored JSON until they are set, as before. A field this code does not know (written by a later
version) is kept as it is, so a record read and written back loses nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from workload.batch_api.objects import COMPLETION_WINDOWS, TERMINAL


class Record(BaseModel):
    """What every stored record has: its id, when it was made, and its order within that second (`_seq`)."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True, extra="allow")
    KIND: ClassVar[str]  # the store's record kind: records/<KIND>/<id>.json
    LATE: ClassVar[tuple[str, ...]] = ()  # stored names left out while empty (never written before they are set)

    id: str
    created_at: int
    seq: int = Field(alias="_seq")

    @classmethod
    def load(cls, stored: dict[str, Any]) -> Self:
        return cls.model_validate(stored)

    def stored(self) -> dict[str, Any]:
        """The record as the store keeps it (JSON-ready, private fields under their underscore names)."""
        data = self.model_dump(mode="json")
        for name in self.LATE:
            if data.get(name) in (None, False):
                data.pop(name, None)
        return data

    def public(self) -> dict[str, Any]:
        """OpenAI's object: the record without its private fields."""
        return {key: value for key, value in self.stored().items() if not key.startswith("_")}


class Owned(Record):
    owner: str = Field(alias="_owner")  # the tenant the caller's key maps to (app.py): only it sees the record


class FileRecord(Owned):
    """openai.types.FileObject, and where its body is (`_key`)."""

    KIND: ClassVar[str] = "file"

    object: str = "file"
    bytes: int
    expires_at: int | None
    filename: str
    purpose: str
    status: str = "processed"  # deprecated in OpenAI's API, still required by its type
    status_details: str | None = None
    key: str = Field(alias="_key")


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchRecord(Owned):
    """openai.types.Batch (with the side field `llm_batch`), and the job's input and output keys, the stop the
        scheduler is carrying out (`_stop`: cancelled or expired), when it closed (`_done_at`) and whether its job
        output has been deleted after the retention (`_output_deleted`), the vision files its lines name
    (`_image_files`), the run it is in beside other batches and since when (`_pool`, `_run_since`), and its state
    changes' events with where each stands in being sent (`_events`: events.py)."""

    KIND: ClassVar[str] = "batch"
    LATE: ClassVar[tuple[str, ...]] = (
        "_done_at", "_output_deleted", "_image_files", "_pool", "_run_since", "_events"
    )  # fmt: skip

    object: str = "batch"
    endpoint: str
    model: str
    errors: dict[str, Any] | None = None
    input_file_id: str
    completion_window: str
    status: str = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    usage: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    # The one field beyond OpenAI's (objects.SIDE_FIELD): the job's GPU time and cost once it closes (gpu_share).
    llm_batch: dict[str, Any] | None = None
    input_key: str = Field(alias="_input_key")
    output_key: str = Field(alias="_output_key")
    stop: str | None = Field(default=None, alias="_stop")
    done_at: int | None = Field(default=None, alias="_done_at")
    output_deleted: bool = Field(default=False, alias="_output_deleted")
    # The vision files its lines name, checked at create to be its owner's (vision.py): file id -> store key.
    image_files: dict[str, str] | None = Field(default=None, alias="_image_files")
    # The run it is in while it runs beside other batches (pools.py): that pool's id; None when it runs alone.
    pool_id: str | None = Field(default=None, alias="_pool")
    run_since: int | None = Field(default=None, alias="_run_since")  # when its current run started (pools.py)
    # Its status changes as events, written with each change and sent by the tick (events.py, event_delivery.py).
    events: list[dict[str, Any]] | None = Field(default=None, alias="_events")

    @classmethod
    def window_end(cls, created_at: int, completion_window: str) -> int:
        return created_at + COMPLETION_WINDOWS[completion_window]

    @property
    def closed(self) -> bool:
        return self.status in TERMINAL


class UploadRecord(Owned):
    """openai.types.Upload, how long the File it makes is to be kept (`_file_expires_after_s`), and the parts that
    completed it (`_completed_parts`)."""

    KIND: ClassVar[str] = "upload"
    LATE: ClassVar[tuple[str, ...]] = ("_completed_parts",)

    object: str = "upload"
    bytes: int
    expires_at: int
    filename: str
    purpose: str
    status: str = "pending"
    file: dict[str, Any] | None = None
    file_expires_after_s: int | None = Field(default=None, alias="_file_expires_after_s")
    # The part ids that completed it: a retried complete with the same ones answers the same Upload (uploads.py).
    completed_parts: list[str] | None = Field(default=None, alias="_completed_parts")


class Tombstone(Owned):
    """Where a deleted File stood in the listing's order (its `created_at` and `_seq`, under its id), kept
    TOMBSTONE_TTL_S: a client paging with `after=<that id>` goes on from there (the SDK's own list-and-delete loop
    asks for the page after a file it just deleted). Never answered to a client."""

    KIND: ClassVar[str] = "tombstone"

    expires_at: int


class NightEntry(Record):
    """The schedule's night in the queue (nights.py): the stack's, so it has no owner and no API key sees it."""

    KIND: ClassVar[str] = "night"
    LATE: ClassVar[tuple[str, ...]] = ("started_at",)

    object: str = "night"
    date: str
    status: str = "queued"
    execution_arn: str | None = None
    started_at: int | None = None
