"""Reading input records and deciding, row by row, what the engine gets and what goes to errors.

Nothing here imports Ray: the job's validation stage (workload/job/input_stream.py) runs these checks on the cluster,
and `workload validate` runs them on one machine, so a bad row becomes an error record with its position, never a
crash and never a silent drop.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from pydantic import ValidationError

from workload.contract.config import InputConfig, SamplingParams
from workload.contract.jsonl_lines import (
    RECORD_HEAD_BYTES,
    TOO_LARGE,
    jsonl_records,
    too_large,
    too_large_parts,
)
from workload.files.images import (
    IMAGE_URLS_KEY,
    IMAGES_KEY,
    ImageRefused,
    ImageRules,
    as_parts,
    check_urls,
    row_images,
    with_row_images,
)
from workload.files.openai_batch import (
    EMBED_KEY,
    OPENAI_COLUMN,
    TEMPLATE_KWARGS_KEY,
    OpenAIDialect,
    RequestRefused,
    message_with_param,
)
from workload.files.openai_batch import to_row as openai_row
from workload.files.responses import RESPONSES_URL, chat_param
from workload.files.storage import Location, StorageError, list_files, locate, read_bytes
from workload.files.template_args import check_kwargs
from workload.files.tools import TOOL_KEYS, ToolsRefused, asks_tools, check_request, forces_call, history_message

# Output columns a pass-through input column may not shadow.
RESERVED_COLUMNS = frozenset(
    {"generated_text", "num_input_tokens", "num_output_tokens", "num_cached_tokens", "finish_reason", "choices"}
)
_ROW_KEYS = frozenset(
    {"id", "prompt", "messages", "sampling_params", TEMPLATE_KWARGS_KEY, IMAGES_KEY, IMAGE_URLS_KEY, *TOOL_KEYS}
)
# An embedding row's own keys, and the output columns its pass-through columns may not shadow.
_EMBED_ROW_KEYS = frozenset({"id", "input", "prompt", EMBED_KEY})
EMBED_RESERVED = frozenset({"embedding", "embeddings", "num_input_tokens"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})


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
    messages: list[dict[str, Any]] | None
    sampling: dict[str, Any]
    origin: Origin
    raw_text: str  # kept so an engine-side failure can still be reported with the row as it was read
    passthrough: dict[str, Any] = field(default_factory=dict)
    # The embed task's request: {"texts": [...], "dimensions": int | None}; None for generation.
    embed: dict[str, Any] | None = None
    # A chat row's own chat-template variables (workload/files/template_args.py); None: the template's defaults.
    chat_template_kwargs: dict[str, Any] | None = None
    # A chat row's tool request (workload/files/tools.py): {"tools", "tool_choice", "parallel_tool_calls"}.
    tools: dict[str, Any] | None = None
    # A chat row's image urls (workload/files/images.py), in the order of its messages' image parts.
    images: list[str] | None = None

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
    if configured == "openai":  # OpenAI Batch files are JSONL
        return "jsonl"
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


def parquet_record(value: dict[str, Any], max_record_bytes: int | None) -> bytes:
    """A Parquet row as it travels between the job's own processes (pickled), or its `too_large` marker."""
    data = pickle.dumps(unset_struct_fields(value))
    if max_record_bytes is not None and len(data) > max_record_bytes:
        return too_large(len(data), json.dumps(value, default=str)[:RECORD_HEAD_BYTES].encode())
    return data


def iter_records(config: InputConfig) -> Iterator[Record]:
    """Every record of every input file, in a stable order (files sorted by path, then file order)."""
    position = 0
    for location in input_files(config):
        try:
            if _format_of(location, config.format) == "jsonl":
                records = jsonl_records([read_bytes(location)], config.max_record_bytes)
                for row, (number, line) in enumerate(records):
                    yield Record(position, Origin(location.uri, row, number), line)
                    position += 1
            else:
                table = pq.read_table(location.path, filesystem=location.fs)
                for row, value in enumerate(table.to_pylist()):
                    raw = parquet_record(value, config.max_record_bytes)
                    record = raw if raw.startswith(TOO_LARGE) else unset_struct_fields(value)
                    yield Record(position, Origin(location.uri, row, None), record)
                    position += 1
        except StorageError as error:
            raise InputError(str(error)) from error
        except OSError as error:
            raise InputError(f"cannot read {location.uri}: {error}") from error


def unset_struct_fields(value: dict[str, Any]) -> dict[str, Any]:
    """A Parquet struct column has one set of fields for all rows, so a field one row never set reads back as
    null: in `sampling_params` and `chat_template_kwargs` that means "not set", not a null value."""
    for key in ("sampling_params", TEMPLATE_KWARGS_KEY):
        struct = value.get(key)
        if isinstance(struct, dict):
            value = {**value, key: {k: v for k, v in struct.items() if v is not None}}
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
    if isinstance(raw, bytes) and raw.startswith(TOO_LARGE):
        raw = too_large_parts(raw)[1]  # the record's first bytes stand for it in errors/
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
    if record.raw.startswith(TOO_LARGE):
        size, _ = too_large_parts(record.raw)
        return _error(record, None, "record_too_large", f"record of {size} bytes is over input.max_record_bytes")
    try:
        text = record.raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return _error(record, None, "invalid_utf8", f"line is not valid UTF-8: {error}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return _error(record, None, "malformed_json", f"line is not valid JSON: {error}")
    except RecursionError:
        return _error(record, None, "malformed_json", "line is JSON nested deeper than the parser allows")
    except ValueError as error:  # an integer past Python's digit limit (int_max_str_digits)
        return _error(record, None, "malformed_json", f"line is JSON this parser cannot read: {error}")
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


# The tool-call turns of a history (workload/files/tools.py): an assistant's calls, a tool's answer to one.
_TOOL_TURN_KEYS = {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}


def _check_messages(messages: Any) -> list[dict[str, Any]] | str:
    """The messages as the template gets them, or what is wrong with them."""
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list of {role, content} objects"
    checked: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        turn_keys = _TOOL_TURN_KEYS.get(role, set()) if isinstance(role, str) else set()
        if not isinstance(message, dict) or set(message) - {"role", "content"} - turn_keys:
            return f"messages[{index}] must be an object with only 'role' and 'content' (and tool-call turns' keys)"
        if role not in _ROLES:
            return f"messages[{index}].role must be one of {sorted(_ROLES)}"
        if role == "tool" or message.get("tool_calls") is not None:
            if message.get("content") is not None and not isinstance(message["content"], str):
                return f"messages[{index}].content must be a string"
            try:
                checked.append(history_message(message, f"messages[{index}]"))
            except ToolsRefused as refused:
                return str(refused)
            continue
        if not isinstance(message.get("content"), str) and not _placed_images(message.get("content")):
            return f"messages[{index}].content must be a string"
        checked.append(message)
    if not any(_has_content(m["content"]) or m.get("tool_calls") for m in checked):
        return "every message is empty"
    return checked


def _placed_images(content: Any) -> bool:
    """Content an OpenAI line's reader made of text and placed image parts (workload/files/images.py)."""
    return isinstance(content, list) and all(
        isinstance(part, dict)
        and (part == {"type": "image"} or (part.get("type") == "text" and isinstance(part.get("text"), str)))
        for part in content
    )


def _has_content(content: Any) -> bool:
    return bool(content.strip()) if isinstance(content, str) else bool(content)


def image_parts(messages: list[dict[str, Any]] | None) -> int:
    return sum(p == {"type": "image"} for m in messages or () if isinstance(m["content"], list) for p in m["content"])


def _images(
    parsed: dict[str, Any], messages: list[dict[str, Any]] | None, rules: ImageRules
) -> tuple[list[dict[str, Any]] | None, list[str] | None]:
    """The row's messages with its images placed, and its image urls; raises ImageRefused."""
    if IMAGE_URLS_KEY in parsed:  # an OpenAI line's, placed already
        urls = list(parsed[IMAGE_URLS_KEY])
    elif parsed.get(IMAGES_KEY) is not None:
        urls = row_images(parsed[IMAGES_KEY])
        if messages is None:
            message = "'images' need 'messages': a 'prompt' row is sent as written"
            raise ImageRefused("invalid_image", message, IMAGES_KEY)
        if image_parts(messages):
            raise ImageRefused("invalid_image", "give images in the 'images' column or as message parts, not both")
        if urls:
            messages = with_row_images(messages, len(urls))
    else:
        urls = []
    if image_parts(messages) != len(urls):
        raise ImageRefused("invalid_messages", f"{image_parts(messages)} image parts for {len(urls)} images")
    check_urls(urls, rules)
    if not urls:
        return messages, None
    return as_parts(messages or []), urls


def _embed_row(
    record: Record, parsed: dict[str, Any], row_id: str, defaults: SamplingParams, openai: bool
) -> ValidRow | RowError:
    """An embedding row: `input` (or `prompt`) text, one vector; or an OpenAI line's texts (`EMBED_KEY`)."""
    shadowed = sorted((EMBED_RESERVED | {EMBED_KEY}) & set(parsed)) if not openai else []
    if shadowed:
        return _error(record, row_id, "reserved_column", f"input columns {shadowed} are output column names")
    request = parsed.get(EMBED_KEY) if openai else None
    if request is None:
        if "messages" in parsed or "sampling_params" in parsed:
            key = "messages" if "messages" in parsed else "sampling_params"
            message = f"an embedding row takes 'input' text; {key!r} is for task generate"
            return _error(record, row_id, "invalid_input", message)
        if "input" in parsed and "prompt" in parsed:
            return _error(record, row_id, "ambiguous_prompt", "row has both 'input' and 'prompt'; give one")
        text = parsed.get("input", parsed.get("prompt"))
        if text is None:
            return _error(record, row_id, "missing_prompt", "row has no 'input' text to embed")
        if not isinstance(text, str):
            return _error(record, row_id, "invalid_prompt", f"'input' must be a string, got {type(text).__name__}")
        if not text.strip():
            return _error(record, row_id, "missing_prompt", "'input' is empty")
        request = {"texts": [text], "dimensions": None}
    passthrough = {key: value for key, value in parsed.items() if key not in _EMBED_ROW_KEYS}
    text_raw, _ = raw_text(record.raw)
    first = request["texts"][0]
    return ValidRow(
        record.position, row_id, first, None, defaults.for_engine(), record.origin, text_raw, passthrough, request
    )


def validate_record(
    record: Record,
    defaults: SamplingParams,
    openai: OpenAIDialect | None = None,
    task: str = "generate",
    tool_parser: str | None = None,
    image_rules: ImageRules = ImageRules.DEFAULT,
) -> ValidRow | RowError:
    """The row the engine gets, or the record's error. `openai`: the input is an OpenAI Batch file, whose request
    lines are first turned into the job's own rows (workload/files/openai_batch.py). `task`: the job's task (an
    embedding row takes text to embed, not a prompt to answer). `tool_parser`: the model's vLLM tool-call parser
    (ModelConfig.tools); None refuses a row with tools, naming why."""
    parsed = _parse(record)
    if isinstance(parsed, RowError):
        return parsed
    bad_text = _bad_text(record, parsed)
    if bad_text is not None:
        return bad_text
    if openai is not None:
        custom_id = parsed.get("custom_id")
        try:
            parsed = openai_row(parsed, openai)
        except RequestRefused as refused:
            known = custom_id if isinstance(custom_id, str) and custom_id else None
            return _error(record, known, refused.error_type, message_with_param(refused))
    raw_id = parsed.get("id")
    row_id = _row_id(raw_id)
    if "id" not in parsed or raw_id is None:
        return _error(record, None, "missing_id", "row has no 'id'")
    if row_id is None:
        return _error(record, None, "invalid_id", f"'id' must be a non-empty string or an integer, got {raw_id!r}")
    if task == "embed":
        return _embed_row(record, parsed, row_id, defaults, openai is not None)
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
        checked = _check_messages(messages)
        if isinstance(checked, str):
            return _error(record, row_id, "invalid_messages", checked)
        messages = checked

    try:
        messages, images = _images(parsed, messages, image_rules)
    except ImageRefused as refused:
        return _error(record, row_id, refused.error_type, refused.message)

    template = _template_kwargs(parsed, messages is not None)
    if isinstance(template, str):
        return _error(record, row_id, "invalid_chat_template_kwargs", template)

    overrides = parsed.get("sampling_params")
    if overrides is not None and not isinstance(overrides, dict):
        return _error(record, row_id, "invalid_sampling_params", "'sampling_params' must be an object")
    try:
        # A row without overrides takes the config's defaults, validated once at load: this runs for every row,
        # twice an attempt (the id pass, the main stream), and a model_dump and validate cost a third of a row's check.
        sampling = SamplingParams.model_validate({**defaults.model_dump(), **overrides}) if overrides else defaults
    except ValidationError as error:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        return _error(record, row_id, "invalid_sampling_params", detail)

    tool_request = _tool_request(parsed, messages is not None, tool_parser)
    if isinstance(tool_request, ToolsRefused):
        return _error(record, row_id, "invalid_tools", _named(tool_request, parsed, openai is not None))
    if tool_request is not None and forces_call(tool_request["tool_choice"]) and sampling.structured_outputs:
        # vLLM's server forces the call through structured outputs: one constraint per answer.
        conflict = ToolsRefused("tool_choice", "a required or named tool_choice cannot take a structured output too")
        return _error(record, row_id, "invalid_tools", _named(conflict, parsed, openai is not None))

    passthrough = {key: value for key, value in parsed.items() if key not in _ROW_KEYS}
    text, _ = raw_text(record.raw)
    return ValidRow(
        record.position,
        row_id,
        prompt,
        messages,
        sampling.for_engine(),
        record.origin,
        text,
        passthrough,
        chat_template_kwargs=template,
        tools=tool_request,
        images=images,
    )


def _tool_request(parsed: dict[str, Any], chat: bool, parser: str | None) -> dict[str, Any] | ToolsRefused | None:
    if not asks_tools(parsed):
        return None
    if not chat:
        return ToolsRefused("tools", "tools need 'messages': a 'prompt' row is sent as written, with no template")
    try:
        return check_request(parsed, parser)
    except ToolsRefused as refused:
        return refused


def _named(refused: ToolsRefused, parsed: dict[str, Any], openai: bool) -> str:
    """The message, with the field as an OpenAI line's error `param` where the row came from one: a /v1/responses
    line's in that API's words (`tools[0].name`, where chat nests `tools[0].function.name`)."""
    if not openai:
        return str(refused)
    field, message = refused.field, str(refused)
    if json.loads(parsed.get(OPENAI_COLUMN) or "{}").get("url") == RESPONSES_URL:
        field = chat_param(field) or field
        message = message.replace(refused.field, field)
    return message_with_param(RequestRefused(message, field))


def _template_kwargs(parsed: dict[str, Any], chat: bool) -> dict[str, Any] | str | None:
    """The row's chat-template variables, or why they are refused (a string)."""
    value = parsed.get(TEMPLATE_KWARGS_KEY)
    if value is None:
        return None
    if not chat:
        return f"{TEMPLATE_KWARGS_KEY} needs 'messages': a 'prompt' row is sent as written, with no template"
    try:
        return check_kwargs(value)
    except ValueError as error:
        return str(error)


@dataclass
class ValidatedInput:
    rows: list[ValidRow]
    errors: list[RowError]
    rows_in: int


def read_input(
    config: InputConfig,
    defaults: SamplingParams,
    openai: OpenAIDialect | None = None,
    task: str = "generate",
    tool_parser: str | None = None,
) -> ValidatedInput:
    """Validate every record; a repeated id keeps its first row and sends the others to errors."""
    rows: list[ValidRow] = []
    errors: list[RowError] = []
    seen: set[str] = set()
    count = 0
    for record in iter_records(config):
        count += 1
        outcome = validate_record(record, defaults, openai, task, tool_parser)
        if isinstance(outcome, RowError):
            errors.append(outcome)
        elif outcome.id in seen:
            errors.append(_error(record, outcome.id, "duplicate_id", f"id {outcome.id!r} appeared earlier"))
        else:
            seen.add(outcome.id)
            rows.append(outcome)
    return ValidatedInput(rows, errors, count)
