"""Counting what the Batch API asks of its store: the requests S3 would bill (GET, LIST, HEAD, PUT, DELETE).

Both stores are real: `CountingStore` wraps a `LocalStore` and counts each of its calls as the S3 request
`S3Store` makes for the same call (a `records(kind)` is one LIST and one GET per record it reads); on S3 (a moto
server) botocore's own `before-call` event counts the requests the client sends. `seed_moto` copies a local
store's objects into the moto server's bucket in-process, by the same keys: a moto server takes about 60 PUTs a
second over HTTP here (measured 2026-12-07), so 10,000 records written through it would take minutes.
`write_finished` writes finished batches' objects straight into a store's folder, as `BatchBook.create` writes
them (the same JSON, keys and markers) at a tenth of its time, for the same reason.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from workload.batch_api.batch_index import DONE_KIND, ORDER_KIND, done_id, order_id
from workload.batch_api.models import BatchRecord
from workload.batch_api.store import LocalStore, Versioned

# botocore's operation names, as the S3 requests they send
_S3_REQUESTS = {
    "GetObject": "GET",
    "HeadObject": "HEAD",
    "ListObjectsV2": "LIST",
    "PutObject": "PUT",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
}


class CountingStore:
    """A `LocalStore` whose calls are counted as the S3 requests `S3Store` sends for them."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner, self.counts = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, kind: str, object_id: str) -> Versioned | None:
        self.counts["GET"] += 1
        return self.inner.get(kind, object_id)

    def put(self, kind: str, record: dict[str, Any], expected: str | None) -> str:
        self.counts["PUT"] += 1
        return self.inner.put(kind, record, expected)

    def delete(self, kind: str, object_id: str) -> None:
        self.counts["DELETE"] += 1
        self.inner.delete(kind, object_id)

    def records(self, kind: str) -> list[dict[str, Any]]:
        found = self.inner.records(kind)
        self.counts["LIST"] += 1
        self.counts["GET"] += len(found)
        return found

    def ids(self, kind: str, after: str | None, limit: int) -> list[str]:
        self.counts["LIST"] += 1
        return list(self.inner.ids(kind, after, limit))

    def read_blob(self, key: str) -> Iterator[bytes] | None:
        self.counts["GET"] += 1
        return self.inner.read_blob(key)

    def blob_size(self, key: str) -> int | None:
        self.counts["HEAD"] += 1
        return self.inner.blob_size(key)

    def list_blobs(self, prefix: str) -> list[str]:
        self.counts["LIST"] += 1
        return self.inner.list_blobs(prefix)

    def write_blob(self, key: str, chunks: Iterable[bytes]) -> int:
        self.counts["PUT"] += 1
        return self.inner.write_blob(key, chunks)

    def delete_blobs(self, prefix: str) -> None:
        self.counts["LIST"] += 1
        self.counts["DELETE"] += 1
        self.inner.delete_blobs(prefix)


def count_s3_requests(client: Any) -> Counter[str]:
    """The S3 requests `client` sends from now on, by kind (GET, LIST, ...), counted as they are sent."""
    counts = Counter[str]()

    def count(model: Any, **_: Any) -> None:
        counts[_S3_REQUESTS.get(model.name, model.name)] += 1

    client.meta.events.register("before-call.s3", count)
    return counts


def reads(counts: Counter[str]) -> dict[str, int]:
    return {kind: counts[kind] for kind in ("GET", "LIST", "HEAD") if counts[kind]}


def seed_moto(root: Path, bucket: str, prefix: str, kinds: Iterable[str], copied: set[Path]) -> int:
    """Copy the records of `kinds` under `root/records` not in `copied` (which it adds them to) into the moto
    server's `bucket` under `prefix`, through moto's own backend (in this process); how many."""
    from moto.s3.models import s3_backends

    backend = s3_backends["123456789012"]["global"]
    paths = [path for kind in kinds for path in (root / "records" / kind).glob("*.json") if path not in copied]
    for path in paths:
        key = prefix + str(path.relative_to(root))
        backend.put_object(bucket, key, path.read_bytes(), disable_notification=True)
        copied.add(path)
    return len(paths)


def write_finished(root: Path, records: Iterable[BatchRecord]) -> None:
    """Each closed batch of `records` with its order and retention markers, as LocalStore keeps them."""
    folders = {kind: root / "records" / kind for kind in ("batch", ORDER_KIND, DONE_KIND)}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    for record in records:
        assert record.closed and record.done_at is not None, record.id
        marked = {ORDER_KIND: order_id(record), DONE_KIND: done_id(record.id, record.done_at)}
        (folders["batch"] / f"{record.id}.json").write_bytes(json.dumps(record.stored(), sort_keys=True).encode())
        for kind, marker in marked.items():
            body = json.dumps({"batch": record.id, "id": marker}, sort_keys=True).encode()
            (folders[kind] / f"{marker}.json").write_bytes(body)
