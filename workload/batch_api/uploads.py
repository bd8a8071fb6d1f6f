"""OpenAI's Uploads API (`/v1/uploads`): a file of OpenAI's size through a front that takes a few MB a request.

The official client's chunked upload (`client.uploads.upload_file_chunked(..., part_size=...)`) sends
`POST /uploads` (bytes, filename, mime_type, purpose), one `POST /uploads/{id}/parts` per part (multipart field
`data`), then `POST /uploads/{id}/complete` with the ordered `part_ids` (and an optional md5). The result is an
ordinary File, usable as a batch's input.

Each part is its own body under `uploads/<upload id>/<part id>`; `complete` streams them, in the order given,
into the file's body through `Store.write_blob` (on S3 a multipart upload of 8 MiB parts). Why not add each
part as an S3 multipart part directly: S3 wants every part but the last to be at least 5 MiB, and the Lambda front
takes at most 6 MB a request, base64 included, so about 4.4 MB of part: the parts a client can send are too small.
Parts are written without touching the Upload's record, so parallel parts never conflict; `complete` and `cancel`
change the record by compare-and-swap, so two completes make one file, and a cancel racing a complete loses or wins
whole. An Upload not completed within an hour expires (OpenAI's rule) and its parts are deleted (lifecycle.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from workload.batch_api.objects import (
    EXPIRES_AFTER_RANGE_S,
    UPLOAD_PURPOSES,
    ApiError,
    file_record,
    new_id,
    not_found,
    public,
)
from workload.batch_api.store import StoreConflict, update_record

if TYPE_CHECKING:
    from workload.batch_api.service import BatchService

UPLOAD_TTL_S = 3600  # "Uploads ... expire after an hour" (OpenAI's Uploads API reference)
MAX_PART_BYTES = 64 * 1024 * 1024  # OpenAI's part limit (openai.resources.uploads: DEFAULT_PART_SIZE is 64 MiB)


def _parts_prefix(upload_id: str) -> str:
    return f"uploads/{upload_id}"


def _upload(service: BatchService, owner: str, upload_id: str) -> tuple[dict[str, Any], str]:
    found = service.store.get("upload", upload_id)
    if found is None or found.record["_owner"] != owner:
        raise not_found("Upload", upload_id, "upload_id")
    return found.record, found.version


def _pending(service: BatchService, record: dict[str, Any]) -> None:
    if record["status"] != "pending":
        raise ApiError(400, f"upload {record['id']} is {record['status']}; it takes no more changes", "upload_id")
    if service.now() >= record["expires_at"]:
        raise ApiError(400, f"upload {record['id']} expired at {record['expires_at']}", "upload_id")


def create_upload(service: BatchService, owner: str, body: dict[str, Any]) -> dict[str, Any]:
    size, filename, purpose = body.get("bytes"), body.get("filename"), body.get("purpose")
    mime_type, expires_after = body.get("mime_type"), body.get("expires_after")
    if purpose not in UPLOAD_PURPOSES:
        raise ApiError(400, f"purpose {purpose!r} not served here; upload batch input as 'batch'", "purpose")
    if not isinstance(filename, str) or not filename:
        raise ApiError(400, "filename is required", "filename")
    if not isinstance(mime_type, str) or not mime_type:
        raise ApiError(400, "mime_type is required (batch input is application/jsonl)", "mime_type")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ApiError(400, "bytes must be a positive integer: the size of the whole file", "bytes")
    if size > service.limits.max_file_bytes:
        raise ApiError(400, f"bytes {size} is over this server's limit of {service.limits.max_file_bytes}", "bytes")
    keep = None
    if expires_after is not None:
        seconds = expires_after.get("seconds") if isinstance(expires_after, dict) else None
        if not isinstance(expires_after, dict) or expires_after.get("anchor") != "created_at":
            raise ApiError(400, "expires_after.anchor must be 'created_at'", "expires_after.anchor")
        low, high = EXPIRES_AFTER_RANGE_S
        if not isinstance(seconds, int) or not low <= seconds <= high:
            raise ApiError(400, f"expires_after.seconds must be between {low} and {high}", "expires_after.seconds")
        keep = seconds
    now = service.now()
    record = {
        "id": new_id("upload"),
        "object": "upload",
        "bytes": size,
        "created_at": now,
        "expires_at": now + UPLOAD_TTL_S,
        "filename": filename,
        "purpose": purpose,
        "status": "pending",
        "file": None,
        "_owner": owner,
        "_seq": service._seq(),
        "_file_expires_after_s": keep,
    }
    service.store.put("upload", record, None)
    return public(record)


def add_part(service: BatchService, owner: str, upload_id: str, chunks: Iterable[bytes]) -> dict[str, Any]:
    record, _ = _upload(service, owner, upload_id)
    _pending(service, record)
    part_id = new_id("part")
    service.store.write_blob(f"{_parts_prefix(upload_id)}/{part_id}", _capped(chunks, MAX_PART_BYTES, "data"))
    return {"id": part_id, "object": "upload.part", "created_at": service.now(), "upload_id": upload_id}


def _capped(chunks: Iterable[bytes], most: int, param: str) -> Iterator[bytes]:
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > most:
            raise ApiError(413, f"the part is larger than the limit of {most} bytes", param)
        yield chunk


def complete_upload(service: BatchService, owner: str, upload_id: str, part_ids: Any, md5: Any) -> dict[str, Any]:
    record, _ = _upload(service, owner, upload_id)
    _pending(service, record)
    if not isinstance(part_ids, list) or not part_ids or not all(isinstance(p, str) for p in part_ids):
        raise ApiError(400, "part_ids must be the non-empty, ordered list of the upload's part ids", "part_ids")
    if len(set(part_ids)) != len(part_ids):
        raise ApiError(400, "part_ids names a part twice", "part_ids")
    if md5 is not None and not isinstance(md5, str):
        raise ApiError(400, "md5 must be a hex string", "md5")
    store, prefix = service.store, _parts_prefix(upload_id)
    total = 0
    for part_id in part_ids:
        size = store.blob_size(f"{prefix}/{part_id}") if part_id.startswith("part_") and "/" not in part_id else None
        if size is None:
            raise ApiError(400, f"part {part_id!r} is not a part of upload {upload_id}", "part_ids")
        total += size
    if total != record["bytes"]:
        raise ApiError(400, f"the parts hold {total} bytes; the upload was created for {record['bytes']}", "part_ids")

    file_id = new_id("file")
    key = f"files/{file_id}.jsonl"
    digest = hashlib.md5(usedforsecurity=False)

    def body() -> Iterator[bytes]:
        for part_id in part_ids:
            for chunk in store.read_blob(f"{prefix}/{part_id}") or iter(()):
                digest.update(chunk)
                yield chunk

    written = store.write_blob(key, body())
    if written != total or (md5 and digest.hexdigest() != md5.lower()):
        store.delete_blobs(key)
        what = "changed while it was read" if written != total else "does not match the md5 given"
        raise ApiError(400, f"the uploaded content {what}", "md5")
    created = service.now()
    keep = min(record["_file_expires_after_s"] or service.limits.retention_s, service.limits.retention_s)
    entry = file_record(
        file_id, record["filename"], record["purpose"], total, created, created + keep,
        owner=owner, seq=service._seq(), key=key,
    )  # fmt: skip
    store.put("file", entry, None)

    def complete(current: dict[str, Any]) -> None:
        _pending(service, current)
        current.update(status="completed", file=public(entry))

    try:
        done = _change(service, upload_id, complete)
    except (ApiError, StoreConflict):  # cancelled, expired or completed by another call meanwhile: no second file
        store.delete("file", file_id)
        store.delete_blobs(key)
        raise
    store.delete_blobs(prefix)
    return public(done)


def cancel_upload(service: BatchService, owner: str, upload_id: str) -> dict[str, Any]:
    _upload(service, owner, upload_id)

    def cancel(current: dict[str, Any]) -> None:
        _pending(service, current)
        current.update(status="cancelled")

    done = _change(service, upload_id, cancel)
    service.store.delete_blobs(_parts_prefix(upload_id))
    return public(done)


def _change(service: BatchService, upload_id: str, change: Any) -> dict[str, Any]:
    return update_record(service.store, "upload", upload_id, change, not_found("Upload", upload_id, "upload_id"))


def sweep_uploads(service: BatchService, now: int) -> None:
    """An Upload past its hour: its parts deleted and its record with them (a completed one's File lives on)."""
    for record in service.store.records("upload"):
        if now >= record["expires_at"]:
            service.store.delete_blobs(_parts_prefix(record["id"]))
            service.store.delete("upload", record["id"])
