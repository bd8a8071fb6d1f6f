"""OpenAI's cursor pages over records: `after` an id, at most `limit`, oldest or newest first.

The SDK's SyncCursorPage reads `data` and `has_more` and asks for the next page `after` the last id, so the
order must be stable: by creation, then by the record's sequence (records.oldest_first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workload.batch_api.models import Record
from workload.batch_api.objects import ApiError, list_page
from workload.batch_api.records import oldest_first


def checked_limit(limit: int, most: int) -> int:
    if not 1 <= limit <= most:
        raise ApiError(400, f"limit must be between 1 and {most}, got {limit}", "limit")
    return limit


def page(
    records: Sequence[Record],
    after: str | None,
    limit: int,
    descending: bool,
    gone: Callable[[str], Record | None] = lambda _: None,
) -> dict[str, Any]:
    """One page; `gone`: where a record deleted since stood (a tombstone), so a cursor naming it still works."""
    ordered = oldest_first(records)
    if descending:
        ordered.reverse()
    if after is not None:
        ids = [record.id for record in ordered]
        if after in ids:
            ordered = ordered[ids.index(after) + 1 :]
        else:
            stood = gone(after)
            if stood is None:
                raise ApiError(400, f"after: no object {after!r} to page from", "after")
            mark = (stood.created_at, stood.seq)
            later = [
                r for r in ordered if ((r.created_at, r.seq) < mark if descending else (r.created_at, r.seq) > mark)
            ]
            ordered = later
    return list_page([record.public() for record in ordered[:limit]], has_more=len(ordered) > limit)
