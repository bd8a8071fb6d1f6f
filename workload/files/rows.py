"""Reading input records and deciding, row by row, what the engine gets and what goes to errors.

Nothing here imports Ray: the job's validation stage (workload/job/input_stream.py) runs these checks on the cluster,
and `workload validate` runs them on one machine, so a bad row becomes an error record with its position, never a
crash and never a silent drop.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from pydantic import ValidationError

from workload.contract.config import InputConfig, SamplingParams
from workload.files.storage import Location, StorageError, list_files, locate, read_bytes

# Output columns a pass-through input column may not shadow.
RESERVED_COLUMNS = frozenset({"generated_text", "num_input_tokens", "num_output_tokens", "finish_reason"})
_ROW_KEYS = frozenset({"id", "prompt", "messages", "sampling_params"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_BOM = b"\xef\xbb\xbf"


class InputError(ValueError):
    """The input as a whole cannot be read (no files, unknown format): stops the run before any work."""


@dataclass(frozen=True)
class Origin:
    """Where a record came from, for error reports."""

    file: str
    row: int  # 0-based record index within the file
    line: int | None  # 1-based line number for JSONL


@dataclass(frozen=True)
class Record:
    position: int  # global 0-based index over all records, in file order: the key of exactly-once
    origin: Origin
    raw: bytes | dict[str, Any]


@dataclass(frozen=True)
class ValidRow:
    position: int
    id: str
    prompt: str | None
    messages: list[dict[str, str]] | None
    sampling: dict[str, Any]
    origin: Origin
    raw_text: str  # kept so an engine-side failure can still be reported with the row as it was read
    passthrough: dict[str, Any] = field(default_factory=dict)

    def failed(self, error_type: str, message: str) -> RowError:
        return RowError(self.position, self.id, self.origin, self.raw_text, "utf-8", error_type, message)


@dataclass(frozen=True)
class RowError:
    position: int
    id: str | None
    origin: Origin
    raw_input: str
    raw_input_encoding: str
    error_type: str
    error_message: str

    def as_record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "input_file": self.origin.file,
            "input_line": self.origin.line,
            "input_row": self.origin.row,
            "raw_input": self.raw_input,
            "raw_input_encoding": self.raw_input_encoding,
            "error_type": self.error_type,
            "error_message": self.error_message,
        }


def _format_of(location: Location, configured: str) -> str:
    if configured != "auto":
        return configured
    name = location.path.lower()
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise InputError(
        f"cannot tell the format of {location.uri} from its extension; set input.format to jsonl or parquet"
    )


def input_files(config: InputConfig) -> list[Location]:
    files = [f for f in list_files(locate(config.uri)) if not f.path.rsplit("/", 1)[-1].startswith((".", "_"))]
    if not files:
        raise InputError(f"input.uri {config.uri} holds no input files")
    return files


def format_of(location: Location, configured: str) -> str:
    return _format_of(location, configured)


def jsonl_records(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every record of a JSONL file given as consecutive chunks of its bytes.

    The one rule for what a record is, shared by the record count that fixes positions and by the readers: a
    blank line carries no record (a trailing newline ends every JSONL file), a UTF-8 byte order mark is a valid
    start of a text file and not part of the first record, and a line's trailing CR is not part of it."""
    number = 0
    carry: list[bytes] = []
    first = True
    for chunk in chunks:
        if first:
            head = b"".join(carry) + chunk
            if len(head) < len(_BOM) and _BOM.startswith(head):  # maybe a BOM split over tiny chunks: wait
                carry = [head]
                continue
            chunk, carry, first = head.removeprefix(_BOM), [], False
        lines = chunk.split(b"\n")
        if len(lines) == 1:  # no line ends in this chunk: a long line goes on
            carry.append(lines[0])
            continue
        lines[0] = b"".join([*carry, lines[0]])
        carry = [lines.pop()]
        for line in lines:
            number += 1
            if line.strip():
                yield number, line.rstrip(b"\r")
    last = b"".join(carry)
    if first:
        last = last.removeprefix(_BOM)
    if last.strip():
        yield number + 1, last.rstrip(b"\r")


def iter_records(config: InputConfig) -> Iterator[Record]:
    """Every record of every input file, in a stable order (files sorted by path, then file order)."""
    position = 0
    for location in input_files(config):
        try:
            if _format_of(location, config.format) == "jsonl":
                for row, (number, line) in enumerate(jsonl_records([read_bytes(location)])):
                    yield Record(position, Origin(location.uri, row, number), line)
                    position += 1
            else:
                table = pq.read_table(location.path, filesystem=location.fs)
                for row, value in enumerate(table.to_pylist()):
                    yield Record(position, Origin(location.uri, row, None), unset_struct_fields(value))
                    position += 1
        except StorageError as error:
            raise InputError(str(error)) from error
        except OSError as error:
            raise InputError(f"cannot read {location.uri}: {error}") from error


def unset_struct_fields(value: dict[str, Any]) -> dict[str, Any]:
    """A Parquet struct column has one set of fields for all rows, so a field one row never set reads back as
    null: in `sampling_params` that means "not set", not a null value."""
    sampling = value.get("sampling_params")
    if isinstance(sampling, dict):
        value = {**value, "sampling_params": {k: v for k, v in sampling.items() if v is not None}}
    return value


def _lone_surrogate(value: Any, where: str = "") -> str | None:
    """The place of the first lone UTF-16 surrogate in a parsed value (JSON's "\\ud800" decodes to one): text
    that no UTF-8 writer, tokenizer or Arrow column can hold."""
    if isinstance(value, str):
        for index, char in enumerate(value):
            if "\ud800" <= char <= "\udfff":
                return f"{where or 'the row'} (character {index}, U+{ord(char):04X})"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate(key, f"a key in {where or 'the row'}") or _lone_surrogate(
                item, f"{where}.{key}" if where else str(key)
            )
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{where}[{index}]")
            if found:
                return found
    return None


def raw_text(raw: bytes | dict[str, Any]) -> tuple[str, str]:
    if isinstance(raw, dict):
        text = json.dumps(raw, default=str, ensure_ascii=False)
        if _lone_surrogate(text):  # keep the record writable as UTF-8: escape what UTF-8 cannot hold
            text = json.dumps(raw, default=str)
        return text, "utf-8"
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def _error(record: Record, row_id: str | None, error_type: str, message: str) -> RowError:
    text, encoding = raw_text(record.raw)
    return RowError(record.position, row_id, record.origin, text, encoding, error_type, message)


def _parse(record: Record) -> dict[str, Any] | RowError:
    if isinstance(record.raw, dict):
        return record.raw
    try:
        text = record.raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return _error(record, None, "invalid_utf8", f"line is not valid UTF-8: {error}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return _error(record, None, "malformed_json", f"line is not valid JSON: {error}")
    if not isinstance(value, dict):
        return _error(record, None, "not_an_object", f"line is JSON {type(value).__name__}, not an object")
    return value


def _bad_text(record: Record, parsed: dict[str, Any]) -> RowError | None:
    where = _lone_surrogate(parsed)
    if where is None:
        return None
    row_id = _row_id(parsed.get("id"))
    return _error(
        record,
        None if row_id is None or _lone_surrogate(row_id) else row_id,  # an id must be writable too
        "invalid_text",
        f"lone UTF-16 surrogate in {where}: not valid Unicode text; the row is not repaired",
    )


def _row_id(value: Any) -> str | None:
    # bool is an int in Python, and never a sensible id.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _check_messages(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list of {role, content} objects"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            return f"messages[{index}] must be an object with only 'role' and 'content'"
        if message.get("role") not in _ROLES:
            return f"messages[{index}].role must be one of {sorted(_ROLES)}"
        if not isinstance(message.get("content"), str):
            return f"messages[{index}].content must be a string"
    if not any(m["content"].strip() for m in messages):
        return "every message is empty"
    return None


def validate_record(record: Record, defaults: SamplingParams) -> ValidRow | RowError:
    parsed = _parse(record)
    if isinstance(parsed, RowError):
        return parsed
    bad_text = _bad_text(record, parsed)
    if bad_text is not None:
        return bad_text
    raw_id = parsed.get("id")
    row_id = _row_id(raw_id)
    if "id" not in parsed or raw_id is None:
        return _error(record, None, "missing_id", "row has no 'id'")
    if row_id is None:
        return _error(record, None, "invalid_id", f"'id' must be a non-empty string or an integer, got {raw_id!r}")
    shadowed = sorted(RESERVED_COLUMNS & set(parsed))
    if shadowed:
        return _error(record, row_id, "reserved_column", f"input columns {shadowed} are output column names")

    prompt, messages = parsed.get("prompt"), parsed.get("messages")
    if prompt is not None and messages is not None:
        return _error(record, row_id, "ambiguous_prompt", "row has both 'prompt' and 'messages'; give one")
    if prompt is None and messages is None:
        return _error(record, row_id, "missing_prompt", "row has neither 'prompt' nor 'messages'")
    if prompt is not None:
        if not isinstance(prompt, str):
            return _error(record, row_id, "invalid_prompt", f"'prompt' must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            return _error(record, row_id, "missing_prompt", "'prompt' is empty")
    else:
        problem = _check_messages(messages)
        if problem:
            return _error(record, row_id, "invalid_messages", problem)

    overrides = parsed.get("sampling_params")
    if overrides is not None and not isinstance(overrides, dict):
        return _error(record, row_id, "invalid_sampling_params", "'sampling_params' must be an object")
    try:
        sampling = SamplingParams.model_validate({**defaults.model_dump(), **(overrides or {})})
    except ValidationError as error:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        return _error(record, row_id, "invalid_sampling_params", detail)

    passthrough = {key: value for key, value in parsed.items() if key not in _ROW_KEYS}
    text, _ = raw_text(record.raw)
    return ValidRow(record.position, row_id, prompt, messages, sampling.for_engine(), record.origin, text, passthrough)


@dataclass
class ValidatedInput:
    rows: list[ValidRow]
    errors: list[RowError]
    rows_in: int


def read_input(config: InputConfig, defaults: SamplingParams) -> ValidatedInput:
    """Validate every record; a repeated id keeps its first row and sends the others to errors."""
    rows: list[ValidRow] = []
    errors: list[RowError] = []
    seen: set[str] = set()
    count = 0
    for record in iter_records(config):
        count += 1
        outcome = validate_record(record, defaults)
        if isinstance(outcome, RowError):
            errors.append(outcome)
        elif outcome.id in seen:
            errors.append(_error(record, outcome.id, "duplicate_id", f"id {outcome.id!r} appeared earlier"))
        else:
            seen.add(outcome.id)
            rows.append(outcome)
    return ValidatedInput(rows, errors, count)
