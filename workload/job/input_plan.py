"""The input's plan, made on the driver before any row is read, and what the driver makes of rows coming back.

The plan lists the input files with their sizes and versions (one listing, no request per file). A JSONL file's
record count comes out of the id pass, the attempt's first read of the input (workload/job/input_stream.py), so no
pass reads the input only to count it; a Parquet file's comes from its footer here. The counts fix every row's
position (files in path order, then file order) and so its shard; the manifest keeps them, so a resume over
unchanged files plans its shards before any read. Nothing here imports Ray.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pyarrow.parquet as pq

from workload.contract.config import InputConfig
from workload.files.openai_batch import EMBEDDINGS_URL, URLS, OpenAIDialect, is_request
from workload.files.pinned import InputChangedError, changed, current_version, open_pinned
from workload.files.rows import InputError, Origin, RowError, format_of, input_files, jsonl_records
from workload.files.storage import Location, StorageError, list_versions

CHUNK_BYTES = 4 << 20  # how much of a file a reader holds at once (plus one line longer than that)
REJECTED_PREFIX = "rejected: "  # the `__inference_error__` of a row that failed validation (never sent to vLLM)


@dataclass(frozen=True)
class InputFile:
    uri: str
    path: str  # the form pyarrow filesystems take
    format: str  # jsonl | parquet
    first: int  # position of its first record (0 until every file before it is counted)
    records: int | None  # None: not counted yet (a JSONL file the id pass counts)
    size: int
    version: str


@dataclass(frozen=True)
class InputPlan:
    files: list[InputFile]
    rows_in: int | None  # None until every file is counted
    max_record_bytes: int = 16 << 20  # the cap the count used; the readers apply the same, so positions agree
    openai: OpenAIDialect | None = None  # an OpenAI Batch input: its one url and the model's names
    task: str = "generate"  # what the engine does: the config's task, or embed for a /v1/embeddings input
    # The files that may hold a row the validation stage rejects (a bad row, or a repeated id's later row), as
    # the id pass found them; None: not known, every file may. The main stream's read of rejected rows skips the rest.
    rejected_files: frozenset[str] | None = None

    @property
    def counted(self) -> bool:
        return self.rows_in is not None

    def with_counts(self, counts: list[int]) -> InputPlan:
        """The plan with every file's record count (`counts`, in file order, from the id pass) and so every row's
        position. A count the plan already had (the manifest's, or a Parquet footer's) must agree: the files are
        pinned to their planned versions, so a difference means the file is not the one planned."""
        files, first = [], 0
        for file, records in zip(self.files, counts, strict=True):
            if file.records is not None and file.records != records:
                raise changed(file.uri, f"it holds {records} records; {file.records} were counted before")
            files.append(replace(file, first=first, records=records))
            first += records
        return replace(self, files=files, rows_in=first)

    def listing(self) -> dict[str, dict[str, Any]]:
        """What the manifest records of each file: size, content version, and the record count."""
        return {f.uri: {"size": f.size, "version": f.version, "records": f.records} for f in self.files}

    def files_with(self, shards: set[int], shard_rows: int) -> list[InputFile]:
        """The files holding a row of one of `shards` (a counted plan's)."""
        wanted = []
        for file in self.files:
            if not file.records:
                continue
            first, last = file.first // shard_rows, (file.first + file.records - 1) // shard_rows
            if any(first <= shard <= last for shard in shards):
                wanted.append(file)
        return wanted


def chunks(stream: Any) -> Iterator[bytes]:
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            return
        yield bytes(chunk)


def _parquet_rows(location: Location, size: int, version: str) -> int:
    # Its footer, through a pinned read: the count is of the very version the listing gave (workload/files/pinned.py).
    try:
        with open_pinned(location, size, version, random_access=True) as stream:
            return int(pq.ParquetFile(stream).metadata.num_rows)
    except InputChangedError:
        raise
    except OSError as error:
        raise InputError(f"cannot read {location.uri}: {error}") from error


def _openai_dialect(config: InputConfig, files: list[InputFile], model_names: frozenset[str]) -> OpenAIDialect | None:
    """An OpenAI Batch input, told by `input.format: openai` or by its first parseable line's shape; its url is
    `input.openai_url`, else that line's (OpenAI allows one url per batch: other lines' urls are their errors)."""
    if config.format not in ("auto", "jsonl", "openai"):
        return None
    first = None
    for file in files:
        if file.format != "jsonl" or file.records == 0:
            continue
        with Location(file.uri).fs.open_input_stream(file.path) as stream:
            for _, raw in jsonl_records(chunks(stream), config.max_record_bytes):
                try:
                    first = json.loads(raw)
                    break
                except (ValueError, RecursionError):
                    continue
        if first is not None:
            break
    if config.format != "openai" and not is_request(first):
        return None
    url = config.openai_url or (first.get("url") if isinstance(first, dict) else None)
    if url not in URLS:
        raise InputError(
            f"{config.uri}: an OpenAI Batch input needs a url of {list(URLS)}; the first request says {url!r} "
            "(set input.openai_url)"
        )
    return OpenAIDialect(str(url), model_names)


def input_task(configured: str, openai: OpenAIDialect | None, uri: str) -> str:
    """The engine's task: an OpenAI Batch input asks for its own (its url), and a config that says otherwise is
    refused before any work rather than answered with the wrong kind of output."""
    if openai is None:
        return configured
    if openai.url == EMBEDDINGS_URL:
        return "embed"
    if configured == "embed":
        raise InputError(
            f"{uri}: task is embed but the input is an OpenAI Batch file for {openai.url}; "
            "give /v1/embeddings requests, or set task: generate"
        )
    return configured


def plan_input(
    config: InputConfig,
    known: dict[str, dict[str, Any]] | None = None,
    model_names: frozenset[str] = frozenset({"llm-batch"}),
    task: str = "generate",
) -> InputPlan:
    """Every input file with its size and version, in path order, and the record counts known without reading
    rows: a Parquet footer's, and `known` (a manifest's listing): a file whose size and version are unchanged keeps
    its recorded count. The others are None until the id pass counts them (`InputPlan.with_counts`).
    `task`: the config's; the plan's is the one the input asks for (`input_task`)."""
    input_files(config)  # raises InputError naming the URI when it holds no input files
    try:
        listed = [(loc, size, version) for loc, size, version in list_versions(config.uri) if _is_input(loc)]
    except StorageError as error:
        raise InputError(str(error)) from error
    formats = [format_of(loc, config.format) for loc, _, _ in listed]
    known = known or {}

    def count(index: int) -> int | None:
        location, size, version = listed[index]
        entry = known.get(location.uri)
        if entry and entry.get("records") is not None and (entry["size"], entry["version"]) == (size, version):
            return int(entry["records"])
        return _parquet_rows(location, size, version) if formats[index] == "parquet" else None

    with ThreadPoolExecutor(max_workers=16) as pool:  # S3 GETs wait on the network, not the CPU
        counts = list(pool.map(count, range(len(listed))))
    files = [
        InputFile(location.uri, location.path, fmt, 0, records, size, version)
        for (location, size, version), fmt, records in zip(listed, formats, counts, strict=True)
    ]
    openai = _openai_dialect(config, files, model_names)
    plan = InputPlan(files, None, config.max_record_bytes, openai, input_task(task, openai, config.uri))
    if all(f.records is not None for f in files):  # a resume over unchanged files: every shard known now
        plan = plan.with_counts([int(f.records or 0) for f in files])
    return plan


def verify_unchanged(files: list[InputFile]) -> None:
    """Raise InputChangedError unless every local file of `files` still has its planned size and modification time.

    The driver calls it before each commit, after every row of the shard was read: a write to the file between its
    read and this check would have moved its modification time. S3 files need no check here: each of their reads
    carried If-Match on the planned ETag."""
    for file in files:
        location = Location(file.uri)
        if location.is_s3:
            continue
        now = current_version(location)
        if now != (file.size, file.version):
            raise changed(file.uri, "removed" if now is None else "size or modification time differs from the plan")


def files_after_plan(config: InputConfig, plan: InputPlan) -> list[str]:
    """Input files under the input URI now that the plan did not list (uploaded during the attempt): one listing.
    They are named in summary.json, never silently left out."""
    planned = {f.uri for f in plan.files}
    try:
        now = [loc.uri for loc, _, _ in list_versions(config.uri) if _is_input(loc)]
    except StorageError as error:
        print(f"[llm-batch] could not list {config.uri} again for files added after the plan: {error}", file=sys.stderr)
        return []
    return sorted(uri for uri in now if uri not in planned)


def _is_input(location: Location) -> bool:
    return not location.path.rsplit("/", 1)[-1].startswith((".", "_"))


def row_error(item: dict[str, Any], error_type: str, message: str) -> RowError:
    """An error record for a row as it came back from the pipeline (a rejected row, or one the engine failed)."""
    origin = Origin(item["_file"], int(item["_row"]), None if item.get("_line") is None else int(item["_line"]))
    return RowError(
        int(item["_pos"]), item.get("id"), origin, item["_raw"], item["_raw_encoding"] or "utf-8", error_type, message
    )


def passthrough_of(value: bytes | None) -> dict[str, Any]:
    return pickle.loads(value) if value else {}
