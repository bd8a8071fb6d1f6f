"""The one rule for what a request is in a JSONL file, shared by everything that counts or reads one: the job's
reader and record count (workload/files/rows.py, workload/job/input_stream.py), and the Batch API's create-time
count and its unanswered-request lines (workload/batch_api/service.py, unfinished.py). Two rules would make the
batch's `request_counts.total` disagree with the rows its job reads (issue 59: a file that opened with a line
holding only a byte order mark was one request at create time and no row in the job).

- A UTF-8 byte order mark at the start of the file is a valid start of a text file, not part of the first line:
  a first line holding only the mark is blank.
- A line that is empty or only ASCII whitespace carries no request (a trailing newline ends every JSONL file).
- A line's trailing CR is not part of it (files written on Windows).
- A line longer than `max_record_bytes` is yielded as a `too_large` marker, never held whole: a reader holds at
  most one chunk and the cap.

Standard library only: the Batch API's front runs it where no engine is installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

BOM = b"\xef\xbb\xbf"

# A record over the cap travels as this marker, its size and its first bytes: no stage ever holds the whole of it,
# and the job's validation stage makes it a `record_too_large` error row. No JSON text starts with NUL.
TOO_LARGE = b"\x00llm-batch:record_too_large:"
RECORD_HEAD_BYTES = 1024


def too_large(size: int, head: bytes) -> bytes:
    return TOO_LARGE + str(size).encode() + b":" + head[:RECORD_HEAD_BYTES]


def too_large_parts(raw: bytes) -> tuple[int, bytes]:
    """A `too_large` marker's record size and first bytes."""
    size, _, head = raw.removeprefix(TOO_LARGE).partition(b":")
    return int(size), head


class _Line:
    """One line's bytes as its chunks arrive; past the cap only its size is kept (and its first bytes)."""

    def __init__(self, cap: int | None) -> None:
        self.parts: list[bytes] = []
        self.size, self.cap, self.over, self.nonblank = 0, cap, False, False

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.over:
            self.nonblank = self.nonblank or bool(piece.strip())
            return
        self.parts.append(piece)
        if self.cap is not None and self.size > self.cap:
            whole = b"".join(self.parts)
            self.nonblank, self.parts, self.over = bool(whole.strip()), [whole[:RECORD_HEAD_BYTES]], True

    def record(self) -> bytes | None:
        if self.over:
            return too_large(self.size, self.parts[0]) if self.nonblank else None
        line = b"".join(self.parts)
        return line.rstrip(b"\r") if line.strip() else None


def jsonl_records(chunks: Iterable[bytes], max_record_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every request of a JSONL file given as consecutive chunks of its bytes, by
    the rule above; None for `max_record_bytes`: no cap (the line is held whole)."""
    number = 0
    line = _Line(max_record_bytes)
    head = b""
    first = True
    for chunk in chunks:
        if first:
            head += chunk
            if len(head) < len(BOM) and BOM.startswith(head):  # maybe a BOM split over tiny chunks: wait
                continue
            chunk, head, first = head.removeprefix(BOM), b"", False
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:
            line.add(piece)
            number += 1
            record = line.record()
            if record is not None:
                yield number, record
            line = _Line(max_record_bytes)
        line.add(pieces[-1])
    if first:
        line.add(head.removeprefix(BOM))
    record = line.record()
    if record is not None:
        yield number + 1, record


def request_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The request lines of a JSONL body (no cap), as `jsonl_records` finds them."""
    return (line for _, line in jsonl_records(chunks))
