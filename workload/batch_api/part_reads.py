"""An Upload's parts read for its complete, several at once (issue 60): the Lambda front has 29 s to put a 200 MB
Upload's 48 parts of 4 MiB together, and one GET after another spends most of it waiting on S3.

Sizes are asked `READERS` at a time; bodies are read `READERS` at a time and handed on in the Upload's order, at
most `AHEAD_BYTES` read ahead of the writer (at least one part), so memory stays bounded whatever the parts' size
(a local part may be 64 MiB). A part gone meanwhile reads as empty: the complete's byte count then refuses it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from workload.batch_api.store import Store

READERS = 8
AHEAD_BYTES = 64 * 1024 * 1024


def sizes(store: Store, keys: list[str]) -> list[int | None]:
    """Each key's size (None: no such blob), asked several at once."""
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        return list(pool.map(store.blob_size, keys))


def bodies(store: Store, keys: list[str], sizes: list[int]) -> Iterator[bytes]:
    """Each key's whole body, in the order of `keys`, read ahead as the module says."""

    def read(key: str) -> bytes:
        return b"".join(store.read_blob(key) or ())

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        pending: deque[tuple[Future[bytes], int]] = deque()
        ahead = 0
        for key, size in zip(keys, sizes, strict=True):
            while pending and (len(pending) >= READERS or ahead + size > AHEAD_BYTES):
                done, held = pending.popleft()
                ahead -= held
                yield done.result()
            pending.append((pool.submit(read, key), size))
            ahead += size
        while pending:
            yield pending.popleft()[0].result()
