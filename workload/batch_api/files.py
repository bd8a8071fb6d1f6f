"""OpenAI's Files (`/v1/files`): a body in the store (`files/<id>.jsonl`) and its record, owned by a tenant.

A file is made three ways: an upload in one request (`upload`), an Upload's parts put together (uploads.py),
and a batch's output written by its job (the scheduler's `output`, whose body stays in the job's output folder).
Every file expires at its `expires_at` (at most the server's retention) and is then deleted, record and body
(`sweep`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from workload.batch_api.models import FileRecord, Tombstone
from workload.batch_api.objects import EXPIRES_AFTER_RANGE_S, UPLOAD_PURPOSES, ApiError, Limits, new_id, not_found
from workload.batch_api.paging import checked_limit, page
from workload.batch_api.quotas import over_quota
from workload.batch_api.records import Records
from workload.batch_api.store import StoreConflict
from workload.batch_api.tenants import sees
from workload.batch_api.vision import VISION, capped, check_image, check_size

TOMBSTONE_TTL_S = 24 * 3600  # a listing paged through within a day goes on past files deleted meanwhile


def check_purpose(purpose: Any) -> None:
    if purpose not in UPLOAD_PURPOSES:
        raise ApiError(
            400, f"purpose {purpose!r} not served here; upload batch input as 'batch', images as 'vision'", "purpose"
        )


def check_expires_after(seconds: Any) -> None:
    low, high = EXPIRES_AFTER_RANGE_S
    if not isinstance(seconds, int) or not low <= seconds <= high:
        raise ApiError(400, f"expires_after.seconds must be between {low} and {high}", "expires_after.seconds")


def body_key(file_id: str) -> str:
    return f"files/{file_id}.jsonl"


class Files:
    def __init__(self, records: Records, limits: Limits) -> None:
        self.records, self.store, self.limits = records, records.store, limits

    def record(
        self, owner: str, file_id: str, filename: str, purpose: str, size: int, key: str, keep_s: int | None = None
    ) -> FileRecord:
        """Record the body at `key` as a File made now, kept `keep_s` (the server's retention caps it)."""
        created = self.records.now()
        keep = min(keep_s or self.limits.retention_s, self.limits.retention_s)
        record = FileRecord(
            id=file_id, filename=filename, purpose=purpose, bytes=size, created_at=created,
            expires_at=created + keep, owner=owner, seq=self.records.seq(), key=key,
        )  # fmt: skip
        self.records.create(record)
        return record

    def upload(
        self,
        owner: str,
        filename: str,
        purpose: str,
        chunks: Iterable[bytes],
        expires_after_s: int | None = None,
        room: int | None = None,
    ) -> dict[str, Any]:
        """`room`: the bytes the owner's quota leaves (quotas.py); a body past it is refused as it streams (429)."""
        check_purpose(purpose)
        if expires_after_s is not None:
            check_expires_after(expires_after_s)
        body = self._capped(chunks, room)
        if purpose == VISION:
            check_size(0, self.limits.max_image_bytes)  # a front serving none refuses before a byte is stored
            body = capped(body, self.limits.max_image_bytes or 0)
        file_id = new_id("file")
        size = self.store.write_blob(body_key(file_id), body)
        if purpose == VISION:
            self.check_vision(body_key(file_id))
        return self.record(owner, file_id, filename, purpose, size, body_key(file_id), expires_after_s).public()

    def check_vision(self, key: str) -> None:
        """A `vision` file's stored body is an image (vision.py), or it is deleted and the upload refused."""
        try:
            check_image(self.store.read_blob(key) or iter(()))
        except ApiError:
            self.store.delete_blobs(key)
            raise

    def _capped(self, chunks: Iterable[bytes], room: int | None = None) -> Iterator[bytes]:
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if room is not None and size > room:
                raise over_quota(
                    f"the file is larger than the {room} bytes this key's quota of stored bytes leaves", "file"
                )
            if size > self.limits.max_file_bytes:
                raise ApiError(
                    413, f"the file is larger than this server's limit of {self.limits.max_file_bytes} bytes", "file"
                )
            yield chunk

    def owned(self, owner: str, file_id: str, param: str = "id") -> FileRecord:
        """The file, if `owner` may see it; another tenant's id answers as an unknown one."""
        found = self.records.get(FileRecord, file_id)
        if found is None or not sees(owner, found.owner):
            raise not_found("File", file_id, param)
        return found

    def content(self, owner: str, file_id: str) -> Iterator[bytes]:
        body = self.store.read_blob(self.owned(owner, file_id).key)
        if body is None:
            raise not_found("File", file_id)
        return body

    def redirect(self, owner: str, file_id: str) -> str | None:
        """Where to send a download too large for the front (`Limits.inline_download_bytes`); None: answer inline."""
        record = self.owned(owner, file_id)
        presign = getattr(self.store, "download_url", None)  # only a store with URLs of its own has one (S3Store)
        inline = self.limits.inline_download_bytes
        if presign is None or inline is None or record.bytes <= inline:
            return None
        return str(presign(record.key))

    def forget(self, record: FileRecord) -> None:
        """Delete the file: its record, then its body; a tombstone keeps its place in the listing's order."""
        stone = Tombstone(
            id=record.id, created_at=record.created_at, seq=record.seq, owner=record.owner,
            expires_at=self.records.now() + TOMBSTONE_TTL_S,
        )  # fmt: skip
        with contextlib.suppress(StoreConflict):  # already there: deleted once before, by a racing call
            self.records.create(stone)
        self.records.delete(FileRecord, record.id)
        self.store.delete_blobs(record.key)

    def delete(self, owner: str, file_id: str) -> dict[str, Any]:
        self.forget(self.owned(owner, file_id))
        return {"id": file_id, "object": "file", "deleted": True}

    def list(self, owner: str, after: str | None, limit: int, order: str, purpose: str | None) -> dict[str, Any]:
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order must be 'asc' or 'desc', got {order!r}", "order")
        mine = [r for r in self.records.all(FileRecord) if sees(owner, r.owner) and purpose in (None, r.purpose)]

        def gone(file_id: str) -> Tombstone | None:
            try:
                found = self.records.get(Tombstone, file_id)
            except ValueError:  # not an id at all
                return None
            return found if found is not None and sees(owner, found.owner) else None

        return page(mine, after, checked_limit(limit, 10_000), descending=order == "desc", gone=gone)

    def sweep(self, now: int, keep: frozenset[str] = frozenset()) -> None:
        """A file past its `expires_at`: record and body deleted, unless it is in `keep` (the input of a batch
        that waits or runs: swept once that batch is done with it); a tombstone past its own, deleted."""
        for record in self.records.all(FileRecord):
            if record.expires_at is not None and now >= record.expires_at and record.id not in keep:
                self.forget(record)
        for tombstone in self.records.all(Tombstone):
            if now >= tombstone.expires_at:
                self.records.delete(Tombstone, tombstone.id)
