"""A stopped batch's error file: the job's error lines, then one line per request its run never answered.

OpenAI closes an expired batch with the answers it has in the output file and each request it did not run in the
error file, with the code `batch_expired` (`batch_cancelled` for a cancel): the codes of OpenAI's
BatchRequestOutput error in its OpenAPI spec. The job knows only what it committed, so the server adds these lines
when it closes the batch: every request of the input (its lines by workload/contract/jsonl_lines.py, the rule
the job reads them by) not answered in output.jsonl or errors.jsonl, matched by `custom_id`
(by count, so a repeated id is answered as often as it was asked; a line whose id cannot be read counts under
None, as the job's error line for it does). Built from the job's files each time, so closing twice (a restart
between the writes) writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

UNFINISHED = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request executed."),
}


def custom_id(line: bytes) -> str | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    found = value.get("custom_id") if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def unfinished_lines(
    batch_id: str, status: str, requests: Iterable[bytes], answered: Iterable[bytes]
) -> Iterator[bytes]:
    """OpenAI's error line for each request of `requests` (the input's lines) that `answered` (the lines of the
    job's output and error files) does not hold; nothing for a status without such lines."""
    if status not in UNFINISHED:
        return
    code, message = UNFINISHED[status]
    left = Counter(custom_id(line) for line in answered)
    for number, line in enumerate(requests, start=1):
        request_id = custom_id(line)
        if left[request_id] > 0:
            left[request_id] -= 1
            continue
        digest = hashlib.sha256(f"{batch_id}:{number}:{code}".encode()).hexdigest()[:24]
        error: dict[str, Any] = {"code": code, "message": message}
        entry = {"id": f"batch_req_{digest}", "custom_id": request_id, "response": None, "error": error}
        yield (json.dumps(entry) + "\n").encode()
