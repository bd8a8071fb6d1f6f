"""Where the Batch API keeps its records (File and Batch objects) and bodies (uploads, the job's output).

`Store` is the one interface the records layer (records.py) needs; `LocalStore` keeps everything under one
folder. The AWS front's store (s3_store.py) keeps the same keys in the stack's bucket: a record's version is then
its ETag, and `put` is a conditional write (`IfNoneMatch="*"` to create, `IfMatch=version` to change), which is
why every change here goes through compare-and-swap on a version too, even though one process owns the folder.

Layout (keys are the same in both):
    records/<kind>/<id>.json                            one object each (file, batch, upload, night), with its
                                                        private fields (models.py types them)
    records/control/open-batches.json                   the open batches' ids (batch_index.py: the tick's index)
    records/batch_order/<key>.json, records/batch_done/  empty markers ordering the batches for the pages and the
                                                        retention (batch_index.py)
    files/<file id>.jsonl                               an uploaded body
    batches/<batch id>/output/                          the job's output folder (output.jsonl, errors.jsonl, ...)
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CHUNK = 1 << 20
# Compare-and-swap rounds before a change gives up: far above what a handful of writers racing on one record
# need (tests/workload/test_batch_api_store.py races 8), so only a store that never settles ends it.
CAS_TRIES = 64


MAX_IDS = 1000  # S3's ListObjectsV2 answers at most 1,000 keys a request
MAX_ID_CHARS = 128  # the longest id this API makes is 45 (an idempotency claim's); OpenAI's are shorter
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_id(object_id: str) -> str:
    """`object_id` if it can name a record; ValueError otherwise (a caller's malformed or overlong id is an unknown
    one, a 404, never a path a store would choke on: a 300-character name is over a file name's limit)."""
    if len(object_id) > MAX_ID_CHARS or not _ID.fullmatch(object_id) or ".." in object_id:
        raise ValueError(f"not an id: {object_id[:40]!r}")
    return object_id


def check_ids_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_IDS:
        raise ValueError(f"a listing of ids takes 1 to {MAX_IDS} at a time, asked {limit}")
    return limit


def is_id(value: str) -> bool:
    try:
        check_id(value)
    except ValueError:
        return False
    return True


class StoreConflict(Exception):
    """The record changed (or came to exist) since it was read: read it again and redo the change."""


class StoreLocked(Exception):
    """Another server already serves this data folder."""


@dataclass(frozen=True)
class Versioned:
    record: dict[str, Any]
    version: str


class Store(Protocol):
    def get(self, kind: str, object_id: str) -> Versioned | None: ...

    def put(self, kind: str, record: dict[str, Any], expected: str | None) -> str:
        """Write `record` if the stored version is `expected` (None: only if absent); its new version.
        Raises StoreConflict otherwise."""
        ...

    def delete(self, kind: str, object_id: str) -> None: ...

    def records(self, kind: str) -> list[dict[str, Any]]: ...

    def ids(self, kind: str, after: str | None, limit: int) -> list[str]:
        """The ids of `kind`'s records in the order of their keys (`<id>.json`, S3's listing order), after the id
        `after`, at most `limit` (1 to MAX_IDS): one listing request, whatever the kind holds."""
        ...

    def write_blob(self, key: str, chunks: Iterable[bytes]) -> int:
        """Store the body `chunks` make under `key`, all or nothing (an exception from `chunks` leaves no body)."""
        ...

    def read_blob(self, key: str) -> Iterator[bytes] | None: ...

    def blob_size(self, key: str) -> int | None: ...

    def list_blobs(self, prefix: str) -> list[str]:
        """The keys of the bodies under `prefix/`, sorted."""
        ...

    def delete_blobs(self, prefix: str) -> None:
        """Delete the body at `prefix` and every body under `prefix/`."""
        ...

    def uri(self, key: str) -> str:
        """Where the job reads or writes `key`: a local path here, an s3:// URI on the tiers."""
        ...


def update_record(
    store: Store, kind: str, object_id: str, change: Callable[[dict[str, Any]], None], missing: Exception
) -> dict[str, Any]:
    """Apply `change` to a copy of the stored record and write it back if nobody wrote in between (compare-and-swap
    on its version), reading it again on a conflict, at most CAS_TRIES times; the record as written. `missing` is
    raised if it is gone."""
    for _ in range(CAS_TRIES):
        found = store.get(kind, object_id)
        if found is None:
            raise missing
        record = json.loads(json.dumps(found.record))
        change(record)
        try:
            store.put(kind, record, found.version)
            return record
        except StoreConflict:
            continue
    raise StoreConflict(f"{kind} {object_id}: changed by another writer on each of {CAS_TRIES} tries; try again")


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _atomic_write(path: Path, chunks: Iterable[bytes]) -> int:
    """Write `chunks` to `path` whole or not at all (temp file, fsync, rename); the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    size = 0
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return size


class LocalStore:
    """A folder: records as JSON files replaced atomically (temp file, fsync, rename), bodies beside them.

    Holds an exclusive lock on `ROOT/.lock` for its life, so two servers never share a folder (the second is
    refused at start, in one line).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_file = (self.root / ".lock").open("a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreLocked(f"another Batch API server already serves {self.root}") from None
        self._cas = threading.Lock()

    def close(self) -> None:
        self._lock_file.close()

    def _record_path(self, kind: str, object_id: str) -> Path:
        return self.root / "records" / kind / f"{check_id(object_id)}.json"

    def _blob_path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ValueError(f"not a key under the store: {key!r}")
        return path

    def get(self, kind: str, object_id: str) -> Versioned | None:
        try:
            data = self._record_path(kind, object_id).read_bytes()
        except (FileNotFoundError, ValueError):
            return None
        return Versioned(json.loads(data), _version(data))

    def put(self, kind: str, record: dict[str, Any], expected: str | None) -> str:
        path = self._record_path(kind, record["id"])
        data = json.dumps(record, sort_keys=True).encode()
        with self._cas:
            try:
                current: str | None = _version(path.read_bytes())
            except FileNotFoundError:
                current = None
            if current != expected:
                raise StoreConflict(f"{kind} {record['id']} changed since it was read")
            _atomic_write(path, [data])
        return _version(data)

    def delete(self, kind: str, object_id: str) -> None:
        with self._cas, contextlib.suppress(FileNotFoundError):
            self._record_path(kind, object_id).unlink()

    def records(self, kind: str) -> list[dict[str, Any]]:
        folder = self.root / "records" / kind
        found = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            with contextlib.suppress(FileNotFoundError):  # deleted between the listing and the read
                found.append(json.loads(path.read_bytes()))
        return found

    def ids(self, kind: str, after: str | None, limit: int) -> list[str]:
        check_ids_limit(limit)
        folder = self.root / "records" / kind
        names = sorted(path.name for path in folder.glob("*.json")) if folder.is_dir() else []
        if after is not None:
            names = names[bisect.bisect_right(names, f"{check_id(after)}.json") :]
        return [name.removesuffix(".json") for name in names[:limit]]

    def write_blob(self, key: str, chunks: Iterable[bytes]) -> int:
        return _atomic_write(self._blob_path(key), chunks)

    def read_blob(self, key: str) -> Iterator[bytes] | None:
        try:
            handle = self._blob_path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError):
            return None

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(CHUNK):
                    yield chunk

        return chunks()

    def blob_size(self, key: str) -> int | None:
        path = self._blob_path(key)
        return path.stat().st_size if path.is_file() else None

    def list_blobs(self, prefix: str) -> list[str]:
        folder = self._blob_path(prefix)
        if not folder.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in folder.rglob("*") if p.is_file())

    def delete_blobs(self, prefix: str) -> None:
        path = self._blob_path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def uri(self, key: str) -> str:
        return str(self._blob_path(key))
