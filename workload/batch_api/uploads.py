"""OpenAI's Uploads API (`/v1/uploads`): a file of OpenAI's size through a front that takes a few MB a request.

The official client's chunked upload (`client.uploads.upload_file_chunked(..., part_size=...)`) sends
`POST /uploads` (bytes, filename, mime_type, purpose), one `POST /uploads/{id}/parts` per part (multipart field
`data`), then `POST /uploads/{id}/complete` with the ordered `part_ids` (and an optional md5). The result is an
ordinary File, usable as a batch's input.

Each part is its own body under `uploads/<upload id>/<part id>`; `complete` streams them, in the order given,
into the file's body through `Store.write_blob` (on S3 a multipart upload of 8 MiB parts, sent several at once),
reading several parts at once (part_reads.py) so a 200 MB Upload is put together well within the front's 29 s.
Why not add each part as an S3 multipart part directly: S3 wants every part but the last to be at least 5 MiB,
and the Lambda front takes at most 6 MB a request, base64 included, so about 4.4 MB of part: the parts a client
can send are too small.
Parts are written without touching the Upload's record, so parallel parts never conflict; `complete` and `cancel`
change the record by compare-and-swap, so two completes make one file, and a cancel racing a complete loses or wins
whole. A complete sent again with the same part ids (its reply was lost) answers the completed Upload. An Upload
not completed within an hour expires (OpenAI's rule) and its parts are deleted (the scheduler's sweep).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from workload.batch_api import part_reads
from workload.batch_api.files import Files, body_key, check_expires_after, check_purpose
from workload.batch_api.models import UploadRecord
from workload.batch_api.objects import ApiError, new_id, not_found
from workload.batch_api.quotas import check_holding
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict, is_id
from workload.batch_api.tenants import sees
from workload.batch_api.vision import VISION, check_size

UPLOAD_TTL_S = 3600  # "Uploads ... expire after an hour" (OpenAI's Uploads API reference)
MAX_PART_BYTES = 64 * 1024 * 1024  # OpenAI's part limit (openai.resources.uploads: DEFAULT_PART_SIZE is 64 MiB)


def _parts_prefix(upload_id: str) -> str:
    return f"uploads/{upload_id}"


def _capped(chunks: Iterable[bytes], most: int, param: str) -> Iterator[bytes]:
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > most:
            raise ApiError(413, f"the part is larger than the limit of {most} bytes", param)
        yield chunk


def _past_declared(declared: int) -> ApiError:
    return ApiError(400, f"the parts would hold more than the {declared} bytes the upload was created for", "data")


def _within_declared(chunks: Iterable[bytes], room: int, declared: int) -> Iterator[bytes]:
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > room:
            raise _past_declared(declared)
        yield chunk


class Uploads:
    def __init__(self, records: Records, files: Files) -> None:
        self.records, self.store, self.files = records, records.store, files

    def _owned(self, owner: str, upload_id: str) -> UploadRecord:
        found = self.records.get(UploadRecord, upload_id)
        if found is None or not sees(owner, found.owner):
            raise not_found("Upload", upload_id, "upload_id")
        return found

    def _pending(self, record: UploadRecord) -> None:
        if record.status != "pending":
            raise ApiError(400, f"upload {record.id} is {record.status}; it takes no more changes", "upload_id")
        if self.records.now() >= record.expires_at:
            raise ApiError(400, f"upload {record.id} expired at {record.expires_at}", "upload_id")

    def create(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        size, filename, purpose = body.get("bytes"), body.get("filename"), body.get("purpose")
        mime_type, expires_after = body.get("mime_type"), body.get("expires_after")
        check_purpose(purpose)
        if not isinstance(filename, str) or not filename:
            raise ApiError(400, "filename is required", "filename")
        if not isinstance(mime_type, str) or not mime_type:
            raise ApiError(400, "mime_type is required (batch input is application/jsonl)", "mime_type")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ApiError(400, "bytes must be a positive integer: the size of the whole file", "bytes")
        most = self.files.limits.max_file_bytes
        if size > most:
            raise ApiError(400, f"bytes {size} is over this server's limit of {most}", "bytes")
        if purpose == VISION:
            check_size(size, self.files.limits.max_image_bytes, "bytes")
        keep = None
        if expires_after is not None:
            if not isinstance(expires_after, dict) or expires_after.get("anchor") != "created_at":
                raise ApiError(400, "expires_after.anchor must be 'created_at'", "expires_after.anchor")
            check_expires_after(expires_after.get("seconds"))
            keep = expires_after["seconds"]
        now = self.records.now()
        record = UploadRecord(
            id=new_id("upload"), bytes=size, created_at=now, expires_at=now + UPLOAD_TTL_S, filename=filename,
            purpose=str(purpose), owner=owner, seq=self.records.seq(), file_expires_after_s=keep,
        )  # fmt: skip
        self.records.create(record)
        return record.public()

    def add_part(self, owner: str, upload_id: str, chunks: Iterable[bytes], most_parts: int) -> dict[str, Any]:
        """A part, refused when the Upload holds `most_parts` (429) or when it would take the parts past the
        Upload's declared `bytes` (400): counted as it streams, so nothing past the declared size is stored."""
        record = self._owned(owner, upload_id)
        self._pending(record)
        prefix = _parts_prefix(upload_id)
        held = self._part_sizes(prefix)
        check_holding(f"parts in upload {upload_id}", len(held), 1, most_parts, "data")
        room = record.bytes - sum(held.values())
        part_id = new_id("part")
        key = f"{prefix}/{part_id}"
        self.store.write_blob(key, _capped(_within_declared(chunks, room, record.bytes), MAX_PART_BYTES, "data"))
        # Parts written in parallel each saw room for themselves: counted again now that this one is stored, and
        # a part that took the Upload past its size is taken back (both racers may be: the client sends again).
        if sum(self._part_sizes(prefix).values()) > record.bytes:
            self.store.delete_blobs(key)
            raise _past_declared(record.bytes)
        return {"id": part_id, "object": "upload.part", "created_at": self.records.now(), "upload_id": upload_id}

    def _part_sizes(self, prefix: str) -> dict[str, int]:
        keys = self.store.list_blobs(prefix)
        sizes = dict(zip(keys, part_reads.sizes(self.store, keys), strict=True))  # asked several at once
        return {key: size for key, size in sizes.items() if size is not None}  # None: deleted since the listing

    def _already(self, record: UploadRecord, part_ids: Any) -> bool:
        """A retried complete: the Upload was completed with these very parts (the first reply was lost)."""
        return record.status == "completed" and record.file is not None and record.completed_parts == part_ids

    def complete(self, owner: str, upload_id: str, part_ids: Any, md5: Any) -> dict[str, Any]:
        record = self._owned(owner, upload_id)
        if self._already(record, part_ids):
            return record.public()
        self._pending(record)
        if not isinstance(part_ids, list) or not part_ids or not all(isinstance(p, str) for p in part_ids):
            raise ApiError(400, "part_ids must be the non-empty, ordered list of the upload's part ids", "part_ids")
        if len(set(part_ids)) != len(part_ids):
            raise ApiError(400, "part_ids names a part twice", "part_ids")
        if md5 is not None and not isinstance(md5, str):
            raise ApiError(400, "md5 must be a hex string", "md5")
        store, prefix = self.store, _parts_prefix(upload_id)
        for part_id in part_ids:
            if not (part_id.startswith("part_") and is_id(part_id)):
                raise ApiError(400, f"part {part_id!r} is not a part of upload {upload_id}", "part_ids")
        keys = [f"{prefix}/{part_id}" for part_id in part_ids]
        found = part_reads.sizes(store, keys)
        for part_id, size in zip(part_ids, found, strict=True):
            if size is None:
                raise ApiError(400, f"part {part_id!r} is not a part of upload {upload_id}", "part_ids")
        part_sizes = [size or 0 for size in found]
        total = sum(part_sizes)
        if total != record.bytes:
            raise ApiError(400, f"the parts hold {total} bytes; the upload was created for {record.bytes}", "part_ids")

        file_id = new_id("file")
        key = body_key(file_id)
        digest = hashlib.md5(usedforsecurity=False)

        def body() -> Iterator[bytes]:
            for chunk in part_reads.bodies(store, keys, part_sizes):  # several parts read at once, in order
                digest.update(chunk)
                yield chunk

        written = store.write_blob(key, body())
        if written != total or (md5 and digest.hexdigest() != md5.lower()):
            store.delete_blobs(key)
            what = "changed while it was read" if written != total else "does not match the md5 given"
            raise ApiError(400, f"the uploaded content {what}", "md5")
        if record.purpose == VISION:
            self.files.check_vision(key)
        entry = self.files.record(
            owner, file_id, record.filename, record.purpose, total, key, record.file_expires_after_s
        )

        def complete(current: UploadRecord) -> None:
            self._pending(current)
            current.status, current.file, current.completed_parts = "completed", entry.public(), list(part_ids)

        try:
            done = self._change(upload_id, complete)
        except (ApiError, StoreConflict):  # cancelled, expired or completed by another call meanwhile: no second file
            self.files.forget(entry)
            now = self.records.get(UploadRecord, upload_id)
            if now is not None and self._already(now, part_ids):
                return now.public()  # a racing retry of this complete made the file: answer it
            raise
        store.delete_blobs(prefix)
        return done.public()

    def cancel(self, owner: str, upload_id: str) -> dict[str, Any]:
        self._owned(owner, upload_id)

        def cancel(current: UploadRecord) -> None:
            self._pending(current)
            current.status = "cancelled"

        done = self._change(upload_id, cancel)
        self.store.delete_blobs(_parts_prefix(upload_id))
        return done.public()

    def _change(self, upload_id: str, change: Any) -> UploadRecord:
        missing = not_found("Upload", upload_id, "upload_id")
        return self.records.update(UploadRecord, upload_id, change, missing)

    def sweep(self, now: int) -> None:
        """An Upload past its hour: its parts deleted and its record with them (a completed one's File lives on)."""
        for record in self.records.all(UploadRecord):
            if now >= record.expires_at:
                self.store.delete_blobs(_parts_prefix(record.id))
                self.records.delete(UploadRecord, record.id)
