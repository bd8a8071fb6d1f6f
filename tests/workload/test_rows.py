"""Row validation: every kind of bad row becomes a named error record; good rows keep their extra columns."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.contract.config import InputConfig, SamplingParams
from workload.files.rows import InputError, read_input

DEFAULTS = SamplingParams(max_tokens=16)


def _jsonl(path: Path, lines: list[bytes | str | dict]) -> Path:
    encoded = [
        line if isinstance(line, bytes) else (json.dumps(line) if isinstance(line, dict) else line).encode()
        for line in lines
    ]
    path.write_bytes(b"\n".join(encoded) + b"\n")
    return path


def test_each_bad_row_kind_is_recorded_with_its_position(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "ok-1", "prompt": "hello", "tag": "a"},
            '{"id": "broken", "prompt": ',
            "[1, 2, 3]",
            {"id": "empty", "prompt": "   "},
            {"id": "none"},
            {"id": "typed", "prompt": 42},
            {"id": "sp", "prompt": "x", "sampling_params": {"temperature": -2}},
            {"id": "sp2", "prompt": "x", "sampling_params": {"max_tokenz": 5}},
            b'{"id": "utf", "prompt": "\xff\xfe"}',
            {"id": "ok-1", "prompt": "again"},
            {"prompt": "no id"},
            {"id": True, "prompt": "bool id"},
            {"id": "both", "prompt": "p", "messages": [{"role": "user", "content": "m"}]},
            {"id": "msgs", "messages": [{"role": "wizard", "content": "m"}]},
            {"id": "ok-2", "messages": [{"role": "user", "content": "hi"}], "sampling_params": {"max_tokens": 3}},
            {"id": 7, "prompt": "integer id"},
            {"id": "shadow", "prompt": "x", "generated_text": "sneaky"},
        ],
    )
    validated = read_input(InputConfig(uri=str(path)), DEFAULTS)
    assert validated.rows_in == 17
    assert [r.id for r in validated.rows] == ["ok-1", "ok-2", "7"]
    kinds = {(e.id, e.error_type) for e in validated.errors}
    assert kinds == {
        (None, "malformed_json"),
        (None, "not_an_object"),
        ("empty", "missing_prompt"),
        ("none", "missing_prompt"),
        ("typed", "invalid_prompt"),
        ("sp", "invalid_sampling_params"),
        ("sp2", "invalid_sampling_params"),
        (None, "invalid_utf8"),
        ("ok-1", "duplicate_id"),
        (None, "missing_id"),
        (None, "invalid_id"),
        ("both", "ambiguous_prompt"),
        ("msgs", "invalid_messages"),
        ("shadow", "reserved_column"),
    }
    assert len(validated.rows) + len(validated.errors) == validated.rows_in
    utf = next(e for e in validated.errors if e.error_type == "invalid_utf8")
    assert utf.raw_input_encoding == "base64"
    assert base64.b64decode(utf.raw_input) == b'{"id": "utf", "prompt": "\xff\xfe"}'
    assert utf.origin.line == 9 and utf.origin.row == 8
    sp2 = next(e for e in validated.errors if e.id == "sp2")
    assert "max_tokenz" in sp2.error_message


def test_row_sampling_overrides_defaults_and_every_row_has_every_key(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "in.jsonl",
        [{"id": "a", "prompt": "x", "sampling_params": {"max_tokens": 5, "seed": 3}}, {"id": "b", "prompt": "y"}],
    )
    rows = read_input(InputConfig(uri=str(path)), DEFAULTS).rows
    assert rows[0].sampling["max_tokens"] == 5 and rows[0].sampling["seed"] == 3
    assert rows[1].sampling["max_tokens"] == 16
    assert set(rows[0].sampling) == set(rows[1].sampling)


def test_folder_of_jsonl_and_parquet_reads_in_path_order(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"id": "j1", "prompt": "x"}])
    pq.write_table(pa.table({"id": ["p1", "p2"], "prompt": ["y", None], "score": [1.5, 2.5]}), tmp_path / "b.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    validated = read_input(InputConfig(uri=str(tmp_path)), DEFAULTS)
    assert [r.id for r in validated.rows] == ["j1", "p1"]
    assert validated.rows[1].passthrough == {"score": 1.5}
    assert [(e.id, e.error_type, e.origin.row) for e in validated.errors] == [("p2", "missing_prompt", 1)]
    assert [r.position for r in validated.rows] == [0, 1]


def test_unreadable_input_stops_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="holds no input files"):
        read_input(InputConfig(uri=str(tmp_path / "nothing")), DEFAULTS)
    (tmp_path / "data.csv").write_text("id,prompt\n")
    with pytest.raises(InputError, match=r"input\.format"):
        read_input(InputConfig(uri=str(tmp_path / "data.csv")), DEFAULTS)


def test_lone_surrogates_anywhere_are_invalid_text_and_pairs_are_fine(tmp_path: Path) -> None:
    # json.dumps writes "\ud800" as an ASCII escape: valid JSON that decodes to text no UTF-8 writer can hold.
    path = _jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "prompt", "prompt": "bad \ud800 text"},
            {"id": "message", "messages": [{"role": "user", "content": "x\udc00"}]},
            {"id": "id\ud83d", "prompt": "fine"},
            {"id": "passthrough", "prompt": "fine", "note": ["ok", {"deep": "\udfff"}]},
            {"id": "key", "prompt": "fine", "meta": {"k\ud800": 1}},
            {"id": "pair", "prompt": "an emoji \ud83d\ude00 is a surrogate pair"},
        ],
    )
    validated = read_input(InputConfig(uri=str(path)), DEFAULTS)
    assert [r.id for r in validated.rows] == ["pair"]
    assert [(e.id, e.error_type) for e in validated.errors] == [
        ("prompt", "invalid_text"),
        ("message", "invalid_text"),
        (None, "invalid_text"),  # an id that cannot be written is no id
        ("passthrough", "invalid_text"),
        ("key", "invalid_text"),
    ]
    assert "prompt (character 4, U+D800)" in validated.errors[0].error_message
    assert "messages[0].content" in validated.errors[1].error_message
    assert "note[1].deep" in validated.errors[3].error_message
    for error in validated.errors:  # every error record stays writable as UTF-8
        json.dumps(error.as_record(), ensure_ascii=False).encode()


def test_byte_order_mark_is_not_part_of_the_first_row(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"id": "first", "prompt": "hi"}\n{"id": "second", "prompt": "there"}\n')
    validated = read_input(InputConfig(uri=str(path)), DEFAULTS)
    assert [r.id for r in validated.rows] == ["first", "second"] and not validated.errors


def test_parquet_struct_fields_a_row_never_set_are_not_nulls(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "prompt": "x", "sampling_params": {"max_tokens": 3, "ignore_eos": True}},
        {"id": "b", "prompt": "x", "sampling_params": {"temperature": 0.5, "stop": ["\n"]}},
        {"id": "c", "prompt": "x"},
        {"id": "d", "prompt": "x", "sampling_params": {"top_p": 7.0}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    validated = read_input(InputConfig(uri=str(tmp_path / "in.parquet")), DEFAULTS)
    by_id = {r.id: r.sampling for r in validated.rows}
    assert by_id["a"]["max_tokens"] == 3 and by_id["a"]["ignore_eos"] is True and by_id["a"]["temperature"] == 0.0
    assert by_id["b"]["temperature"] == 0.5 and by_id["b"]["stop"] == ["\n"] and by_id["b"]["max_tokens"] == 16
    assert by_id["c"] == DEFAULTS.for_engine()
    [error] = validated.errors
    assert error.id == "d" and error.error_type == "invalid_sampling_params" and "top_p" in error.error_message


def test_parquet_chat_template_kwargs_a_row_never_set_are_not_nulls(tmp_path: Path) -> None:
    """A struct column of template variables (issue 55): a variable one row never set is not a null variable
    (a null `enable_thinking` would read as thinking off to a template that tests `not enable_thinking`)."""
    chat = [{"role": "user", "content": "Hi"}]
    rows = [
        {"id": "a", "messages": chat, "chat_template_kwargs": {"enable_thinking": False}},
        {"id": "b", "messages": chat, "chat_template_kwargs": {"reasoning_effort": "low"}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    validated = read_input(InputConfig(uri=str(tmp_path / "in.parquet")), DEFAULTS)
    by_id = {r.id: r.chat_template_kwargs for r in validated.rows}
    assert by_id == {"a": {"enable_thinking": False}, "b": {"reasoning_effort": "low"}} and not validated.errors


def test_a_record_split_over_any_chunks_reads_as_in_one_piece() -> None:
    """The streamed readers see a file chunk by chunk: a line (or the BOM) cut anywhere reads the same."""
    from workload.contract.jsonl_lines import jsonl_records

    data = b'\xef\xbb\xbf{"id": 1}\r\n\n  \n{"id": 2, "prompt": "' + b"x" * 50 + b'"}\n{"id": 3}'
    whole = list(jsonl_records([data]))
    assert whole == [(1, b'{"id": 1}'), (4, b'{"id": 2, "prompt": "' + b"x" * 50 + b'"}'), (5, b'{"id": 3}')]
    for size in (1, 2, 3, 7, 64):
        pieces = [data[i : i + size] for i in range(0, len(data), size)]
        assert list(jsonl_records(pieces)) == whole, size
