"""The input's plan, made on the driver before any row is read, and what the driver makes of rows coming back.

The plan lists the input files with their sizes and versions (one listing, no request per file). A JSONL file's
record count comes out of the id pass, the attempt's first read of the input (workload/job/input_stream.py), so no
pass reads the input only to count it; a Parquet file's comes from its footer here. The counts fix every row's
position (files in path order, then file order) and so its shard; the manifest keeps them, so a resume over
unchanged files plans its shards before any read. Nothing here imports Ray.

A file's identity across attempts is the sha256 of its bytes (`digest`), which the id pass takes of the bytes it
reads anyway; the version (ETag, modification time) only pins reads within an attempt, since an identical
re-upload can change it (workload/files/pinned.py). A resume whose listing shows a file at another version but
the recorded size hashes that file on the driver, pinned to the new version, before it claims any work
(`hash_moved_files`): the same bytes resume, other bytes are refused naming the file and both digests
(`input_changes`).
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
from workload.contract.jsonl_lines import jsonl_records
from workload.files.images import ImageRules
from workload.files.openai_batch import EMBEDDINGS_URL, URLS, OpenAIDialect, is_request
from workload.files.pinned import InputChangedError, changed, content_digest, current_version, open_pinned
from workload.files.rows import InputError, Origin, RowError, format_of, input_files
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
    digest: str | None = None  # "sha256:<hex>" of its bytes; None until the id pass (or a resume's check) hashed it


@dataclass(frozen=True)
class InputPlan:
    files: list[InputFile]
    rows_in: int | None  # None until every file is counted
    max_record_bytes: int = 16 << 20  # the cap the count used; the readers apply the same, so positions agree
    openai: OpenAIDialect | None = None  # an OpenAI Batch input: its one url and the model's names
    task: str = "generate"  # what the engine does: the config's task, or embed for a /v1/embeddings input
    tool_parser: str | None = None  # the model's vLLM tool-call parser (ModelConfig.tools); None: tools refused
    images: ImageRules = ImageRules.DEFAULT  # where a row's images may come from, how many (input.image_prefix, ...)

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

    def with_digests(self, digests: dict[str, str]) -> InputPlan:
        """The plan with the digests the id pass took ({uri: digest}); a file it did not hash keeps its own."""
        return replace(self, files=[replace(f, digest=digests.get(f.uri, f.digest)) for f in self.files])

    def listing(self) -> dict[str, dict[str, Any]]:
        """What the manifest records of each file: size, content version, digest, and the record count."""
        return {
            f.uri: {"size": f.size, "version": f.version, "digest": f.digest, "records": f.records} for f in self.files
        }

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


# The dialect check's first read: a request line is a few hundred bytes, so one ranged GET of this many nearly
# always holds it, where a read of CHUNK_BYTES fetched up to 4 MiB of a file the id pass reads whole anyway.
FIRST_LINE_BYTES = 64 << 10


def _growing_chunks(handle: Any) -> Iterator[bytes]:
    """A file's bytes front to back in reads of FIRST_LINE_BYTES, then twice as many each time up to CHUNK_BYTES:
    on S3 each read is one ranged GET (`open_pinned(random_access=True)`), so a reader that stops at the first line
    fetches little more than that line."""
    size = FIRST_LINE_BYTES
    while chunk := handle.read(size):
        yield bytes(chunk)
        size = min(size * 2, CHUNK_BYTES)


def _parquet_rows(location: Location, size: int, version: str) -> int:
    # Its footer, through a pinned read: the count is of the very version the listing gave (workload/files/pinned.py).
    try:
        with open_pinned(location, size, version, random_access=True) as stream:
            return int(pq.ParquetFile(stream).metadata.num_rows)
    except InputChangedError:
        raise
    except OSError as error:
        raise InputError(f"cannot read {location.uri}: {error}") from error


def _openai_dialect(
    config: InputConfig, files: list[InputFile], model_names: frozenset[str], adapters: frozenset[str] = frozenset()
) -> OpenAIDialect | None:
    """An OpenAI Batch input, told by `input.format: openai` or by its first parseable line's shape; its url is
    `input.openai_url`, else that line's (OpenAI allows one url per batch: other lines' urls are their errors)."""
    if config.format not in ("auto", "jsonl", "openai"):
        return None
    first = None
    for file in files:
        if file.format != "jsonl" or file.records == 0:
            continue
        # Pinned like every other read of the input (workload/files/pinned.py): a file replaced since the listing
        # is refused by name here, not judged by bytes the id pass will never see. Read by growing ranges: this
        # read is made on every attempt, a resume's included, and needs one line.
        try:
            with open_pinned(Location(file.uri), file.size, file.version, random_access=True) as handle:
                for _, raw in jsonl_records(_growing_chunks(handle), config.max_record_bytes):
                    try:
                        first = json.loads(raw)
                        break
                    except (ValueError, RecursionError):
                        continue
        except InputChangedError:
            raise
        except OSError as error:
            raise InputError(f"cannot read {file.uri}: {error}") from error
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
    return OpenAIDialect(str(url), model_names, mixed_chat=config.openai_url is None, adapters=adapters)


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
    tool_parser: str | None = None,
    adapters: frozenset[str] = frozenset(),
) -> InputPlan:
    """Every input file with its size and version, in path order, and the record counts known without reading
    rows: a Parquet footer's, and `known` (a manifest's listing): a file whose size and version are unchanged keeps
    its recorded count. The others are None until the id pass counts them (`InputPlan.with_counts`).
    `task`: the config's; the plan's is the one the input asks for (`input_task`). `tool_parser`: the model's
    (ModelConfig.tools), which the validation stages judge a row's tools by. `adapters`: the LoRA adapters' names
    (`model.adapters`), which an OpenAI line's `model` may give."""
    input_files(config)  # raises InputError naming the URI when it holds no input files
    try:
        listed = [(loc, size, version) for loc, size, version in list_versions(config.uri) if _is_input(loc)]
    except StorageError as error:
        raise InputError(str(error)) from error
    formats = [format_of(loc, config.format) for loc, _, _ in listed]
    known = known or {}

    def count(index: int) -> tuple[int | None, str | None]:
        location, size, version = listed[index]
        entry = known.get(location.uri)
        if entry and (entry["size"], entry["version"]) == (size, version):  # the very version recorded
            if entry.get("records") is not None:
                return int(entry["records"]), entry.get("digest")
            digest = entry.get("digest")
        else:
            digest = None
        return (_parquet_rows(location, size, version) if formats[index] == "parquet" else None), digest

    with ThreadPoolExecutor(max_workers=16) as pool:  # S3 GETs wait on the network, not the CPU
        counts = list(pool.map(count, range(len(listed))))
    files = [
        InputFile(location.uri, location.path, fmt, 0, records, size, version, digest)
        for (location, size, version), fmt, (records, digest) in zip(listed, formats, counts, strict=True)
    ]
    openai = _openai_dialect(config, files, model_names, adapters)
    plan = InputPlan(
        files,
        None,
        config.max_record_bytes,
        openai,
        input_task(task, openai, config.uri),
        tool_parser=tool_parser,
        images=ImageRules.of(config),
    )
    if all(f.records is not None for f in files):  # a resume over unchanged files: every shard known now
        plan = plan.with_counts([int(f.records or 0) for f in files])
    return plan


def hash_moved_files(plan: InputPlan, known: dict[str, dict[str, Any]] | None) -> InputPlan:
    """A resume's plan with a digest for every file listed at another version than `known` (the manifest's
    listing) records but at its recorded size: an identical re-upload (a new ETag) or copy (a new modification
    time). Each is read once on the driver, pinned to its new version; one whose bytes are the recorded ones keeps
    its recorded record count, so a resume over re-uploaded input plans its shards without a read. The comparison
    itself is `input_changes`'s. Nothing is read when every version is the recorded one."""
    known = known or {}
    moved = [
        f
        for f in plan.files
        if f.digest is None
        and (entry := known.get(f.uri)) is not None
        and entry.get("digest")
        and entry["size"] == f.size
        and entry["version"] != f.version
    ]
    if not moved:
        return plan
    with ThreadPoolExecutor(max_workers=16) as pool:  # S3 GETs wait on the network, not the CPU
        digests = dict(zip([f.uri for f in moved], pool.map(_digest_of, moved), strict=True))
    files = []
    for file in plan.files:
        digest = digests.get(file.uri, file.digest)
        entry = known.get(file.uri) or {}
        same = file.uri in digests and digest == entry.get("digest") and entry.get("records") is not None
        files.append(replace(file, digest=digest, records=int(entry["records"]) if same else file.records))
    hashed = replace(plan, files=files)
    if all(f.records is not None for f in files):  # every count known again: every shard known now
        hashed = hashed.with_counts([int(f.records or 0) for f in files])
    return hashed


def _digest_of(file: InputFile) -> str:
    return content_digest(Location(file.uri), file.size, file.version)


def input_changes(recorded: dict[str, dict[str, Any]], listing: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between the input an output was made from (`recorded`, the manifest's listing) and the input
    now (`listing`), one entry per file naming it and what changed; [] when it is the same input.

    A file is the same when its size is, and its version is or (after `hash_moved_files`) its digest is. A file
    the output never counted (an attempt stopped before its id pass ended: no shard is committed before every file
    is counted) placed no row, so any new bytes of it are taken. A counted file whose version moved with no
    recorded digest to compare (an output begun before digests were recorded) counts as changed: rows of another
    input must never land at the same positions."""
    changes = []
    for uri in sorted(recorded.keys() | listing.keys()):
        old, new = recorded.get(uri), listing.get(uri)
        if new is None:
            changes.append(f"{uri} (removed)")
        elif old is None:
            changes.append(f"{uri} (added)")
        elif old.get("records") is None and not old.get("digest"):
            continue
        elif old["size"] != new["size"]:
            changes.append(f"{uri} (size changed: {old['size']} bytes before, {new['size']} now)")
        elif old["version"] == new["version"]:
            continue
        elif old.get("digest") and new.get("digest"):
            if old["digest"] != new["digest"]:
                changes.append(f"{uri} (content changed: {old['digest']} before, {new['digest']} now)")
        else:
            changes.append(
                f"{uri} (content changed: version {old['version']} before, {new['version']} now, and no digest "
                "recorded to tell whether the bytes are the same)"
            )
    return changes


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
