"""The input as a stream: the cluster reads the files, validates rows in a stage and marks repeated ids, while the
driver holds only what is per file (the plan) or per shard, never per row.

1. Plan (driver, cheap; workload/job/input_plan.py): the files, their sizes and versions (one listing), and the
   record counts known without a read (a manifest's, a Parquet footer's).
2. Id pass (cluster), the attempt's first read: read and validate every row, keep (id, key) of the valid ones and
   group them by id in Ray Data's hash-partitioned aggregation: each node holds only its partitions. A key is the
   file's index and the row's number in it, so the pass needs no count before it; the same read counts each
   file's records, which fix every row's position (files in path order, then file order) and so its shard. What
   comes back to the driver is one (id, first position) per id that repeats, and a count per file. The same pass
   decides one Arrow type per pass-through column, whether any row has `messages` and whether any row is seeded,
   over the whole input, and takes the sha256 of each file not yet hashed (of the JSONL bytes it streams; a
   Parquet file up to PARQUET_WHOLE_BYTES is read whole and parsed from memory; a larger one, read by ranges, is
   read once more front to back), the input's identity for a resume.
3. Main stream (cluster): read again, only the files and rows of shards not yet committed; validate; a row whose
   id repeats and is not that id's first is a `duplicate_id` error. The valid rows go to the engine's stages;
   the same parse hands the bad rows, as error rows with their file, line and raw bytes, to the driver beside
   the stream (workload/job/rejects.py), so every row reaches the driver exactly once, in its shard, and each
   line is parsed twice per attempt: once by the id pass, once here.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data
from ray.data.aggregate import Count, Min
from ray.data.datasource import FileBasedDatasource

from workload.contract.config import SamplingParams
from workload.contract.jsonl_lines import TOO_LARGE, jsonl_records
from workload.files.images import IMAGES_COLUMN, ImageRules
from workload.files.openai_batch import ADAPTER_COLUMN, OpenAIDialect, adapter_of
from workload.files.pinned import changed, content_digest, open_pinned
from workload.files.results import JSON_TYPE
from workload.files.rows import Origin, Record, RowError, ValidRow, parquet_record, raw_text, validate_record
from workload.files.storage import Location
from workload.files.template_args import TEMPLATE_KWARGS_COLUMN
from workload.files.tools import TOOLS_COLUMN
from workload.job.driver_node import on_driver_node
from workload.job.input_plan import REJECTED_PREFIX, InputFile, InputPlan, chunks


def _arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type of a sampling field, from its annotation (`int | None` is a nullable int64)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        return pa.list_(_arrow_type(args[0]))
    if args and typing.get_origin(annotation) is not list:
        return _arrow_type(args[0])
    known = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    if annotation not in known:
        raise TypeError(f"no Arrow type for a sampling field of type {annotation!r}")
    return known[annotation]


# One explicit type for every row's `sampling_params`: inferred per block, a field no row of a block set (an empty
# `stop` list, a null seed) would get another type than in the next block, and Ray cannot concatenate the two.
SAMPLING_TYPE = pa.struct(
    [(name, _arrow_type(field.annotation)) for name, field in SamplingParams.model_fields.items()]
)
BLOCK_ROWS = 1024  # rows per block a reader yields: small enough to stream, big enough to batch
BLOCK_BYTES = 16 << 20
# A Parquet file not yet hashed, up to this size, is read whole into its read task's memory, hashed and parsed
# there (one read); a larger one is read by ranges and then once more front to back to hash it, so a read task
# never holds more than this of one file.
PARQUET_WHOLE_BYTES = 128 << 20
ERROR_COLUMN = "__inference_error__"


class RecordReader:
    """Our record rule, what each read task runs: a file opened pinned to its planned version, streamed chunk by
    chunk, yielding blocks of raw records with their positions. Apart from Ray, so it runs in any process.

    `digests`: told (uri, "sha256:<hex>") of each file without a digest once the whole of it has been read."""

    def __init__(
        self,
        files: list[InputFile],
        shard_rows: int,
        shards: set[int] | None,
        max_record_bytes: int | None = None,
        digests: Callable[[str, str], None] | None = None,
    ) -> None:
        self._max_record_bytes = max_record_bytes
        self._digests = digests
        self._by_path = {f.path: f for f in files}
        self._shard_rows = shard_rows
        self._shards = frozenset(shards) if shards is not None else None  # None: every row

    def _file_of(self, path: str) -> InputFile:
        found = self._by_path.get(path) or self._by_path.get(path.lstrip("/"))
        if found is None:
            found = next(f for p, f in self._by_path.items() if p.lstrip("/") == path.lstrip("/"))
        return found

    def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
        # Not pyarrow's stream: a read pinned to the planned version (If-Match on S3; size and mtime locally).
        file = self._file_of(path)
        if file.format == "parquet":
            return contextlib.nullcontext(None)  # Parquet needs random access: opened in _parquet_records
        return open_pinned(Location(file.uri), file.size, file.version)

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        file = self._file_of(path)
        block = _BlockBuilder(file.uri)
        hashed: dict[str, str] = {}  # a Parquet file read whole: its digest, taken of the bytes parsed
        if file.format == "jsonl":
            records: Iterator[tuple[int, int | None, bytes]] = (
                (row, line, raw) for row, (line, raw) in enumerate(jsonl_records(chunks(f), self._max_record_bytes))
            )
        else:
            whole = self._digests is not None and file.digest is None and file.size <= PARQUET_WHOLE_BYTES
            records = self._parquet_records(file, hashed if whole else None)
        for row, line, raw in records:
            # More records in the planned bytes than the id pass counted: not the same file.
            if file.records is not None and row >= file.records:
                raise changed(file.uri, f"it holds more than the {file.records} records the plan counted")
            position = file.first + row
            if self._shards is not None and position // self._shard_rows not in self._shards:
                continue
            block.add(position, row, line, raw)
            if block.full:
                yield block.take()
        if self._digests is not None and file.digest is None:
            # JSONL: the stream hashed every byte it gave the records above; a Parquet file up to
            # PARQUET_WHOLE_BYTES was read whole and hashed; a larger one was read by ranges, and is read again.
            digest = getattr(f, "digest", None) if file.format == "jsonl" else hashed.get(file.uri)
            self._digests(file.uri, digest or content_digest(Location(file.uri), file.size, file.version))
        if block.rows:
            yield block.take()

    def _parquet_records(
        self, file: InputFile, hashed: dict[str, str] | None
    ) -> Iterator[tuple[int, int | None, bytes]]:
        """The file's rows. With `hashed`, the file is read whole in one pinned stream, hashed as read, and parsed
        from memory: one GET of its bytes where reading by ranges and then hashing fetched them twice."""
        # A Parquet row is a dict, not bytes: it travels pickled (one run's own data, between its own processes).
        with contextlib.ExitStack() as opened:
            if hashed is None:
                source = opened.enter_context(
                    open_pinned(Location(file.uri), file.size, file.version, random_access=True)
                )
            else:
                stream = opened.enter_context(open_pinned(Location(file.uri), file.size, file.version))
                whole = bytearray()  # grown in place and wrapped without a copy: the file is held once
                for chunk in chunks(stream):
                    whole += chunk
                source = pa.BufferReader(pa.py_buffer(whole))
                hashed[file.uri] = str(stream.digest)  # every planned byte was read: read() raises if fewer
            row = 0
            for batch in pq.ParquetFile(source).iter_batches(batch_size=BLOCK_ROWS):
                for value in batch.to_pylist():
                    yield row, None, parquet_record(value, self._max_record_bytes)
                    row += 1


class RecordSource(RecordReader, FileBasedDatasource):
    """Ray Data's file reader machinery (parallel read tasks, retries, S3 through pyarrow) over our record rule."""

    def __init__(
        self,
        files: list[InputFile],
        filesystem: Any,
        shard_rows: int,
        shards: set[int] | None,
        max_record_bytes: int | None = None,
        digests: Callable[[str, str], None] | None = None,
    ) -> None:
        FileBasedDatasource.__init__(self, [f.path for f in files], filesystem=filesystem)
        RecordReader.__init__(self, files, shard_rows, shards, max_record_bytes, digests)


class _BlockBuilder:
    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.positions: list[int] = []
        self.rows: list[int] = []
        self.lines: list[int | None] = []
        self.raws: list[bytes] = []
        self.size = 0

    def add(self, position: int, row: int, line: int | None, raw: bytes) -> None:
        self.positions.append(position)
        self.rows.append(row)
        self.lines.append(line)
        self.raws.append(raw)
        self.size += len(raw)

    @property
    def full(self) -> bool:
        return len(self.rows) >= BLOCK_ROWS or self.size >= BLOCK_BYTES

    def take(self) -> pa.Table:
        table = pa.table(
            {
                "_pos": pa.array(self.positions, pa.int64()),
                "_file": pa.array([self.uri] * len(self.rows), pa.string()),
                "_row": pa.array(self.rows, pa.int64()),
                "_line": pa.array(self.lines, pa.int64()),
                "_record": pa.array(self.raws, pa.large_binary()),
            }
        )
        self.__init__(self.uri)  # type: ignore[misc]
        return table


def read_records(
    files: list[InputFile],
    shard_rows: int,
    shards: set[int] | None,
    num_cpus: float,
    concurrency: int | None = None,
    max_record_bytes: int | None = None,
    digests: Callable[[str, str], None] | None = None,
) -> ray.data.Dataset:
    """`num_cpus` per read task: reading waits on storage more than it computes, and beside an engine that holds
    whole CPUs a read task asking for one would never be scheduled on a small node. `concurrency`: the most read
    tasks at once (None: as many as there are files)."""
    filesystem = Location(files[0].uri).fs
    return ray.data.read_datasource(
        RecordSource(files, filesystem, shard_rows, shards, max_record_bytes, digests),
        ray_remote_args={"num_cpus": num_cpus},
        concurrency=concurrency,
    )


def _records(batch: pa.Table) -> Iterator[Record]:
    lines = batch.column("_line").to_pylist()
    for position, file, row, line, raw in zip(
        batch.column("_pos").to_pylist(),
        batch.column("_file").to_pylist(),
        batch.column("_row").to_pylist(),
        lines,
        batch.column("_record").to_pylist(),
        strict=True,
    ):
        value: bytes | dict[str, Any] = raw if line is not None or raw.startswith(TOO_LARGE) else pickle.loads(raw)
        yield Record(position, Origin(file, row, line), value)


# --- the id pass ----------------------------------------------------------------------------------------------


@dataclass
class InputFacts:
    """What only the whole input can tell, gathered by the id pass."""

    types: dict[str, Any]  # pass-through column -> Arrow type, or JSON_TYPE
    seeded: bool = False  # a row sets its own sampling seed
    has_messages: bool = False  # a row is a chat (the chat-template stage is needed)
    valid_rows: int = 0  # rows that passed validation: none, and no engine is needed at all

    def merge(self, other: InputFacts) -> None:
        for column, kind in other.types.items():
            self.types[column] = _unify(self.types.get(column), kind)
        self.seeded = self.seeded or other.seeded
        self.has_messages = self.has_messages or other.has_messages
        self.valid_rows += other.valid_rows


def _unify(a: Any, b: Any) -> Any:
    if a is None or a == b:
        return b
    if JSON_TYPE in (a, b):
        return JSON_TYPE
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    try:
        schema = pa.unify_schemas([pa.schema([("v", a)]), pa.schema([("v", b)])], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return JSON_TYPE
    return schema.field("v").type


def facts_of(rows: list[ValidRow]) -> InputFacts:
    columns = sorted({key for row in rows for key in row.passthrough})
    types: dict[str, Any] = {}
    for column in columns:
        try:
            types[column] = pa.array([row.passthrough.get(column) for row in rows]).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            types[column] = JSON_TYPE
    return InputFacts(
        types,
        seeded=any(row.sampling.get("seed") is not None for row in rows),
        has_messages=any(row.messages is not None for row in rows),
        valid_rows=len(rows),
    )


class _FactsCollector:
    """One small actor the id pass's tasks report to: what it holds is per column or per file, not per row."""

    def __init__(self) -> None:
        self.facts = InputFacts({})
        self.seen: set[int] = set()  # the first position of each block reported: one entry per block
        self.records: dict[int, int] = {}  # file index -> its records: the highest row number seen, plus one
        self.digests: dict[str, str] = {}  # uri -> the sha256 of its bytes (a retried read reports the same)

    def add(self, block: int, facts: InputFacts, records: dict[int, int]) -> None:
        for file, count in records.items():  # a maximum: a retried task's report changes nothing
            self.records[file] = max(self.records.get(file, 0), count)
        if block not in self.seen:  # a retried task reports its block again: counted once
            self.seen.add(block)
            self.facts.merge(facts)

    def result(self) -> tuple[InputFacts, dict[int, int]]:
        return self.facts, self.records

    def add_digest(self, uri: str, digest: str) -> None:
        self.digests[uri] = digest

    def digests_found(self) -> dict[str, str]:
        return dict(self.digests)


class _DigestReport:
    """What a read task calls with a file's digest: a report to the collector actor (picklable, unlike a lambda)."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def __call__(self, uri: str, digest: str) -> None:
        ray.get(self.collector.add_digest.remote(uri, digest))


# The id pass's key of a row: its file's index above KEY_BITS, its row number in the file below. Keys order rows
# as positions do (files in path order, then file order), so the smallest key of an id is its first row.
KEY_BITS = 40


def _records_per_file(keys: pa.Array) -> dict[int, int]:
    """{file index: highest row number + 1} over the keys of one block."""
    counts: dict[int, int] = {}
    for key in keys.to_pylist():
        file, row = key >> KEY_BITS, key & ((1 << KEY_BITS) - 1)
        counts[file] = max(counts.get(file, 0), row + 1)
    return counts


def _valid_ids(
    batch: pa.Table,
    defaults: SamplingParams,
    collector: Any,
    openai: OpenAIDialect | None,
    task: str = "generate",
    tool_parser: str | None = None,
    images: ImageRules = ImageRules.DEFAULT,
) -> pa.Table:
    checked = [validate_record(rec, defaults, openai, task, tool_parser, images) for rec in _records(batch)]
    rows = [r for r in checked if isinstance(r, ValidRow)]
    keys = batch.column("_pos")
    first = keys[0].as_py() if batch.num_rows else -1
    ray.get(collector.add.remote(first, facts_of(rows), _records_per_file(keys)))
    return pa.table(
        {"id": pa.array([r.id for r in rows], pa.string()), "_pos": pa.array([r.position for r in rows], pa.int64())}
    )


def id_pass(
    plan: InputPlan, defaults: SamplingParams, partitions: int, num_cpus: float
) -> tuple[dict[str, int], InputFacts, InputPlan]:
    """{id: its first position} for every id that repeats, the input's facts, and the plan with every file's
    record count (counted by this read). The grouping is Ray Data's hash-partitioned aggregation; only repeated ids
    and a count per file come back to the driver."""
    collector = ray.remote(num_cpus=0, scheduling_strategy=on_driver_node())(_FactsCollector).remote()
    # Each file's rows are keyed by the file's index and their row number (KEY_BITS): no count is needed first.
    keyed = [replace(f, first=index << KEY_BITS) for index, f in enumerate(plan.files)]
    ids = read_records(
        [f for f in keyed if f.records != 0],
        1,
        None,
        num_cpus,
        max_record_bytes=plan.max_record_bytes,
        digests=_DigestReport(collector),
    ).map_batches(
        _valid_ids,
        fn_kwargs={
            "defaults": defaults,
            "collector": collector,
            "openai": plan.openai,
            "task": plan.task,
            "tool_parser": plan.tool_parser,
            "images": plan.images,
        },
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=num_cpus,
    )
    grouped = ids.groupby("id", num_partitions=partitions).aggregate(
        Count(alias_name="n"), Min("_pos", alias_name="first")
    )
    repeated = grouped.filter(_repeats)
    first_keys: dict[str, int] = {}
    for batch in repeated.iter_batches(batch_size=None, batch_format="pyarrow"):
        first_keys.update(zip(batch.column("id").to_pylist(), batch.column("first").to_pylist(), strict=True))
    facts, records = ray.get(collector.result.remote())
    digests = ray.get(collector.digests_found.remote())
    with contextlib.suppress(Exception):
        ray.kill(collector)
    counted = plan.with_counts([records.get(index, 0) for index in range(len(plan.files))])
    counted = _hash_unread(counted.with_digests(digests))
    return positions_of(first_keys, counted), facts, counted


def _hash_unread(plan: InputPlan) -> InputPlan:
    """The plan with a digest for each file the pass did not read and no manifest hashed (one known to hold no
    record: an empty file, a Parquet file of no rows), read here on the driver."""
    unread = {f.uri: f for f in plan.files if f.digest is None}
    found = {uri: content_digest(Location(uri), f.size, f.version) for uri, f in unread.items()}
    return plan.with_digests(found) if found else plan


def positions_of(first_keys: dict[str, int], counted: InputPlan) -> dict[str, int]:
    """{id: its first row's key} as {id: its first row's position}, by the counted plan."""
    starts = [f.first for f in counted.files]
    mask = (1 << KEY_BITS) - 1
    return {row_id: starts[key >> KEY_BITS] + (key & mask) for row_id, key in first_keys.items()}


def _repeats(row: dict[str, Any]) -> bool:
    return bool(row["n"] > 1)


# --- the main stream's validation stage ------------------------------------------------------------------------

# `_embed`: an embedding row's texts and dimensions as JSON (workload/engine/embed.py), null for generation.
# TEMPLATE_KWARGS_COLUMN: a chat row's own chat-template variables as JSON (workload/engine/pipeline.py), or null.
# TOOLS_COLUMN: a chat row's tool request as JSON (workload/files/tools.py), or null.
# IMAGES_COLUMN: a chat row's image urls as JSON (workload/files/images.py), or null: the image stage fetches them.
# ADAPTER_COLUMN: the LoRA adapter an OpenAI line's `model` named (workload/engine/adapters.py), or null.
# fmt: off
ENGINE_FIELDS = (
    "_pos", "id", "prompt", "messages_json", "sampling_params", "_max_tokens", "_passthrough", "_embed",
    TEMPLATE_KWARGS_COLUMN, TOOLS_COLUMN, IMAGES_COLUMN, ADAPTER_COLUMN,
)
# fmt: on
ERROR_FIELDS = ("_file", "_row", "_line", "_raw", "_raw_encoding", "_error_type", ERROR_COLUMN)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _validated(
    batch: pa.Table,
    defaults: SamplingParams,
    duplicates: dict[str, int],
    rejects: Callable[[pa.Table], None],
    openai: OpenAIDialect | None = None,
    task: str = "generate",
    tool_parser: str | None = None,
    images: ImageRules = ImageRules.DEFAULT,
) -> pa.Table:
    """One block of records, parsed and validated once: the valid ones returned as the engine's input, the bad
    ones handed to `rejects` as error rows (`__inference_error__` set, with the record's file, line, row and raw
    bytes; workload/job/rejects.py), when there are any."""
    valid: dict[str, list[Any]] = {name: [] for name in ENGINE_FIELDS + ERROR_FIELDS}
    rejected: dict[str, list[Any]] = {name: [] for name in ENGINE_FIELDS + ERROR_FIELDS}
    fallback = defaults.for_engine()
    for record in _records(batch):
        outcome = validate_record(record, defaults, openai, task, tool_parser, images)
        if isinstance(outcome, ValidRow) and duplicates.get(outcome.id, record.position) != record.position:
            text, encoding = raw_text(record.raw)
            outcome = RowError(
                record.position,
                outcome.id,
                record.origin,
                text,
                encoding,
                "duplicate_id",
                f"id {outcome.id!r} appeared earlier",
            )
        if isinstance(outcome, ValidRow):
            columns = valid
            values = {
                "_pos": outcome.position,
                "id": outcome.id,
                "prompt": outcome.prompt,
                "messages_json": None if outcome.messages is None else json.dumps(outcome.messages),
                "sampling_params": outcome.sampling,
                "_max_tokens": int(outcome.sampling["max_tokens"]),
                "_passthrough": pickle.dumps(outcome.passthrough) if outcome.passthrough else None,
                "_embed": None if outcome.embed is None else json.dumps(outcome.embed),
                TEMPLATE_KWARGS_COLUMN: _json_or_none(outcome.chat_template_kwargs),
                TOOLS_COLUMN: _json_or_none(outcome.tools),
                IMAGES_COLUMN: _json_or_none(outcome.images),
                ADAPTER_COLUMN: adapter_of(outcome.passthrough),
                "_file": outcome.origin.file,
                "_row": outcome.origin.row,
                "_line": outcome.origin.line,
                "_raw": outcome.raw_text,
                "_raw_encoding": "utf-8",
                "_error_type": None,
                ERROR_COLUMN: "",
            }
        else:
            columns = rejected
            values = {
                "_pos": outcome.position,
                "id": outcome.id,
                "prompt": None,
                "messages_json": None,
                "sampling_params": fallback,  # every row carries one, so every block has one schema
                "_max_tokens": int(fallback["max_tokens"]),
                "_passthrough": None,
                "_embed": None,
                TEMPLATE_KWARGS_COLUMN: None,
                TOOLS_COLUMN: None,
                IMAGES_COLUMN: None,
                ADAPTER_COLUMN: None,
                "_file": outcome.origin.file,
                "_row": outcome.origin.row,
                "_line": outcome.origin.line,
                "_raw": outcome.raw_input,
                "_raw_encoding": outcome.raw_input_encoding,
                "_error_type": outcome.error_type,
                ERROR_COLUMN: REJECTED_PREFIX + outcome.error_message,
            }
        for name, value in values.items():
            columns[name].append(value)
    if rejected["_pos"]:
        rejects(_table(rejected))
    return _table(valid)


_TYPES = {
    "sampling_params": SAMPLING_TYPE,
    "_pos": pa.int64(),
    "_row": pa.int64(),
    "_line": pa.int64(),
    "_max_tokens": pa.int64(),
    "_passthrough": pa.binary(),
}


def _table(columns: dict[str, list[Any]]) -> pa.Table:
    return pa.table({name: pa.array(values, _TYPES.get(name, pa.string())) for name, values in columns.items()})


def input_stream(
    plan: InputPlan,
    defaults: SamplingParams,
    duplicates: dict[str, int],
    shard_rows: int,
    shards: set[int],
    num_cpus: float,
    rejects: Callable[[pa.Table], None],
    read_concurrency: int,
) -> ray.data.Dataset:
    """The rows of `shards`, read and validated once: the valid ones as this dataset (the pipeline's input, see
    workload/engine/pipeline.py's build_pipeline), the ones that failed validation handed to `rejects` as error
    rows (workload/job/rejects.py says why they travel beside the stream).

    `read_concurrency` caps the read tasks: unlike the id pass, this read only has to keep ahead of the engines,
    and every read task beyond that takes CPU from them (see stream_read_concurrency)."""
    files = plan.files_with(shards, shard_rows)
    return read_records(files, shard_rows, shards, num_cpus, read_concurrency, plan.max_record_bytes).map_batches(
        _validated,
        fn_kwargs={
            "defaults": defaults,
            "duplicates": duplicates,
            "rejects": rejects,
            "openai": plan.openai,
            "task": plan.task,
            "tool_parser": plan.tool_parser,
            "images": plan.images,
        },
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=num_cpus,
    )


# One read task parses and validates thousands of short rows a second, far more than an engine answers; two per
# engine replica keep the engines fed while a slow file or object waits. Uncapped, every file's read task starts at
# once and, on a node whose engine runs on the CPU, takes that CPU from it: on 2 cores the first engine request
# came 1.7x later at 200,000 rows than at 20,000 with the readers uncapped.
READ_TASKS_PER_ENGINE = 2


def stream_read_concurrency(engine_replicas: int) -> int:
    """Read tasks at once, per read of the main stream, for up to `engine_replicas` engines."""
    return READ_TASKS_PER_ENGINE * max(1, engine_replicas)
