"""The queue's order (issue 62): priority first, then the end of the completion window, then age.

A batch's priority is its key's (`Quotas.priorities`, workload/contract/batch_api_priorities.py), or lower when
its metadata asks (`llm_batch_priority`: a batch may step back behind its key's other work, never ahead of
another key's). It is worked out from the record and the config at each tick, not stored: a key whose priority
the stack changes reorders its queued batches at the next tick, and there is nothing stored to go stale. The
tick reads every open batch anyway (the open-batches index, batch_index.py), so ordering them costs what is
open, never what has finished.

Among equal priorities the batch whose window ends first goes first (OpenAI's windows are all 24 h, so that is
the oldest, as before), then by creation. A night of the schedule (nights.py) has no key and no window of its
own: it runs at the default priority with the schedule's day as its window, so with no priorities set the queue
is the oldest-first queue it always was.
"""

from __future__ import annotations

from collections.abc import Iterable

from workload.batch_api.models import BatchRecord, Record
from workload.batch_api.objects import COMPLETION_WINDOWS, ApiError
from workload.contract.batch_api_priorities import DEFAULT_PRIORITY, METADATA_KEY, parse_priority
from workload.contract.batch_api_quotas import BatchApiQuotas

NIGHT_WINDOW_S = COMPLETION_WINDOWS["24h"]  # a night is due before the next one


def asked_priority(metadata: dict[str, str] | None, key_priority: int) -> int | None:
    """The priority the batch's metadata asks for (None: none asked); a 400 naming the field when it is not an
    integer in range, or is above its key's (a batch may only lower its key's priority)."""
    if not metadata or METADATA_KEY not in metadata:
        return None
    field = f"metadata.{METADATA_KEY}"
    try:
        asked = parse_priority(metadata[METADATA_KEY], field)
    except ValueError as error:
        raise ApiError(400, str(error), field) from None
    if asked > key_priority:
        message = f"{field} is {asked}, above this key's priority {key_priority}: a batch may only lower its key's"
        raise ApiError(400, message, field)
    return asked


def batch_priority(record: BatchRecord, quotas: BatchApiQuotas) -> int:
    """The priority the queue runs the batch at now: its key's, or its metadata's where that is lower."""
    key = quotas.key_priority(record.owner)
    asked = (record.metadata or {}).get(METADATA_KEY)
    if asked is None:
        return key
    try:
        return min(key, int(asked))
    except ValueError:  # checked at create; a record written otherwise runs at its key's priority
        return key


def queue_order(entries: Iterable[Record], quotas: BatchApiQuotas) -> list[Record]:
    """What waits for the GPUs, first to run first: batches and the schedule's nights."""

    def place(entry: Record) -> tuple[int, int, int, int]:
        if isinstance(entry, BatchRecord):
            priority, ends = batch_priority(entry, quotas), entry.expires_at
        else:
            priority, ends = DEFAULT_PRIORITY, entry.created_at + NIGHT_WINDOW_S
        return (-priority, ends, entry.created_at, entry.seq)

    return sorted(entries, key=place)
