"""The output layout and its commit protocol: every input row lands exactly once, across any number of attempts.

Layout under the output URI:
    results/part-<shard>.parquet     committed results of one shard
    errors/part-<shard>.jsonl        committed error records of one shard (only when it has any)
    _commits/shard-<shard>.json      the commit marker: a shard exists for readers once its marker does
    _pending/...                     parts written before their marker; never read as results
    _failed.json                     the last attempt failed (why); removed when an attempt starts
    _interrupted.json                the last attempt was stopped by SIGTERM; a rerun resumes
    _manifest.json                   what the output was made with (config hash, input fingerprint, attempts)
    _lease.json                      the live attempt's lease (workload/job/lease.py); absent between attempts
    summary.json                     written last, once every shard is committed
    output.jsonl, errors.jsonl       an OpenAI Batch input's answers in OpenAI's format, rebuilt from the commits

A shard commit writes its parts to _pending/ (each write atomic), then the marker (atomic), then moves the parts
into results/ and errors/. A run killed before the marker leaves only _pending/ files, which the next attempt
deletes; killed after it, the next attempt finishes the move (roll forward). So results/ never holds a row
of an uncommitted shard, on a local disk (rename) as on S3 (single-object PUT and copy, no rename needed).

Only the holder of the output's lease writes here: every write, move and delete first calls the store's `guard`
(the lease's `check`), so an attempt that lost its lease stops before its next change.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from workload import failpoints
from workload.files.storage import (
    Location,
    delete_file,
    delete_tree,
    exists,
    list_files,
    locate,
    move,
    read_bytes,
    read_many,
    write_bytes_atomic,
)

RESULTS = "results"
ERRORS = "errors"
COMMITS = "_commits"
PENDING = "_pending"
MANIFEST = "_manifest.json"
SUMMARY = "summary.json"
# What the nightly state machine watches for beside summary.json: the file's name says whether to retry.
FAILURE = "_failed.json"  # the attempt failed; retrying the same config will not help by itself
INTERRUPTED = "_interrupted.json"  # stopped by SIGTERM after committing what was finished: retry to resume


OPENAI_FILES = ("output.jsonl", "errors.jsonl")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class ShardCommit:
    shard: int
    rows_ok: int
    rows_failed: int
    input_tokens: int
    output_tokens: int
    attempt: int
    committed_at: str
    files: list[str]  # paths relative to the output root, e.g. "results/part-000003.parquet"
    error_types: dict[str, int]


def _part_name(shard: int, folder: str) -> str:
    extension = "parquet" if folder == RESULTS else "jsonl"
    return f"{folder}/part-{shard:06d}.{extension}"


def _marker_name(shard: int) -> str:
    return f"{COMMITS}/shard-{shard:06d}.json"


def _shard_of(name: str) -> int | None:
    stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
    _, _, number = stem.rpartition("-")
    return int(number) if number.isdigit() else None


def _no_guard() -> None:
    pass


class OutputStore:
    def __init__(self, uri: str, guard: Callable[[], None] = _no_guard) -> None:
        self.root: Location = locate(uri)
        self._guard = guard  # raises when this process may no longer change the output (its lease is lost)
        # Shards whose marker names files found neither published nor pending: redone, and their stale files
        # replaced, by this attempt (filled by `recover`).
        self.untrusted: dict[int, list[str]] = {}

    def _at(self, relative: str) -> Location:
        return self.root.child(*relative.split("/"))

    # Every change to the output goes through these three, behind the guard.
    def _write(self, location: Location, data: bytes, metadata: dict[str, str] | None = None) -> None:
        self._guard()
        write_bytes_atomic(location, data, metadata)

    def _delete(self, location: Location) -> None:
        self._guard()
        delete_file(location)

    def _move(self, source: Location, target: Location) -> None:
        self._guard()
        move(source, target)

    def read_part(self, relative: str) -> bytes | None:
        """A committed part (`ShardCommit.files`), or None where the shard has none of that kind."""
        location = self._at(relative)
        return read_bytes(location) if exists(location) else None

    def write_file(self, name: str, data: bytes) -> None:
        """A file the run derives from its commits (the OpenAI Batch output files), behind the lease's guard."""
        self._write(self._at(name), data)

    def _read_json(self, relative: str) -> dict[str, Any] | None:
        location = self._at(relative)
        if not exists(location):
            return None
        value = json.loads(read_bytes(location))
        return value if isinstance(value, dict) else None

    def _write_json(self, relative: str, value: dict[str, Any]) -> None:
        self._write(self._at(relative), json.dumps(value, indent=2, sort_keys=True).encode())

    # --- run identity -------------------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any] | None:
        return self._read_json(MANIFEST)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._write_json(MANIFEST, manifest)

    def reset(self) -> None:
        """Delete everything the job writes here (an explicit restart); nothing else below the URI."""
        for folder in (RESULTS, ERRORS, COMMITS, PENDING):
            self._guard()
            delete_tree(self._at(folder))
        for name in (MANIFEST, SUMMARY, FAILURE, INTERRUPTED, *OPENAI_FILES):
            self._delete(self._at(name))

    # --- shards -------------------------------------------------------------------------------------------
    def committed(self) -> dict[int, ShardCommit]:
        """Every commit marker, listed once and read in parallel (an output of thousands of shards reopens in
        seconds, not one request after another)."""
        commits: dict[int, ShardCommit] = {}
        for data in read_many(list_files(self._at(COMMITS))):
            commit = ShardCommit(**json.loads(data))
            commits[commit.shard] = commit
        return commits

    def _relative(self, location: Location) -> str:
        return location.uri[len(self.root.uri) + 1 :]

    def recover(self) -> dict[int, ShardCommit]:
        """Finish what a killed attempt left: roll committed shards forward, delete parts no marker names.

        Returns the shards that are committed and whole. A marker whose files are neither published nor pending
        is reported and not trusted: its shard is redone. No file of a shard that has a marker is deleted here.
        """
        markers = self.committed()
        pending = {self._relative(f)[len(PENDING) + 1 :] for f in list_files(self._at(PENDING))}
        published = {self._relative(f) for folder in (RESULTS, ERRORS) for f in list_files(self._at(folder))}
        self.untrusted = {}
        for number, commit in markers.items():
            missing = [name for name in commit.files if name not in pending and name not in published]
            if missing:
                self.untrusted[number] = missing
                print(
                    f"[llm-batch] shard {number}: its marker names {', '.join(missing)}, found neither published "
                    "nor pending; not trusted, the shard is redone",
                    file=sys.stderr,
                )
                continue
            for name in commit.files:
                if name in pending:
                    # On S3 a move is copy + delete; a kill between the two is finished by the next recover().
                    self._move(self._at(f"{PENDING}/{name}"), self._at(name))
        for folder in (PENDING, RESULTS, ERRORS):
            for part in list_files(self._at(folder)):
                shard = _shard_of(part.path)
                stale_temporary = part.path.rsplit("/", 1)[-1].startswith(".")
                if shard is None or shard not in markers or stale_temporary:
                    self._delete(part)
        return {shard: commit for shard, commit in markers.items() if shard not in self.untrusted}

    def _publish(self, commit: ShardCommit) -> None:
        for relative in commit.files:
            pending = self._at(f"{PENDING}/{relative}")
            if exists(pending):
                self._move(pending, self._at(relative))
        if commit.shard in self.untrusted:
            # The shard was redone: a published part of the old commit that the new one does not name would
            # show its rows twice.
            for folder in (RESULTS, ERRORS):
                name = _part_name(commit.shard, folder)
                if name not in commit.files:
                    self._delete(self._at(name))
            del self.untrusted[commit.shard]

    def commit_shard(
        self,
        shard: int,
        results: pa.Table | None,
        errors: list[dict[str, Any]],
        stats: dict[str, Any],
        attempt: int,
    ) -> ShardCommit:
        files: list[str] = []
        if results is not None and results.num_rows:
            buffer = io.BytesIO()
            pq.write_table(results, buffer, compression="zstd")
            name = _part_name(shard, RESULTS)
            self._write(self._at(f"{PENDING}/{name}"), buffer.getvalue())
            files.append(name)
        if errors:
            name = _part_name(shard, ERRORS)
            lines = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in errors)
            self._write(self._at(f"{PENDING}/{name}"), lines.encode())
            files.append(name)
        failpoints.reached(failpoints.SHARD_PARTS_WRITTEN)
        commit = ShardCommit(
            shard=shard,
            rows_ok=stats["rows_ok"],
            rows_failed=stats["rows_failed"],
            input_tokens=stats["input_tokens"],
            output_tokens=stats["output_tokens"],
            attempt=attempt,
            committed_at=utc_now(),
            files=files,
            error_types=dict(stats["error_types"]),
        )
        self._write_json(_marker_name(shard), asdict(commit))
        failpoints.reached(failpoints.SHARD_COMMITTED)
        self._publish(commit)
        return commit

    # --- the end ------------------------------------------------------------------------------------------
    def _write_note(self, name: str, reason: str, extra: dict[str, Any]) -> None:
        # The reason also travels as S3 metadata (ASCII, short), which a Step Functions state can read without
        # fetching the object's body.
        short = reason.encode("ascii", "replace").decode()[:900]
        body = {"reason": reason, **extra, "at": utc_now()}
        data = json.dumps(body, indent=2, sort_keys=True).encode()
        self._write(self._at(name), data, metadata={"reason": short})

    def write_failure(self, error_type: str, message: str) -> None:
        reason = f"{error_type}: {message}"
        self._write_note(FAILURE, reason, {"error_type": error_type, "error_message": message})

    def write_interrupted(self, signal_name: str, shards_left: int) -> None:
        reason = f"stopped by {signal_name} with {shards_left} shard(s) left; a rerun resumes"
        self._write_note(INTERRUPTED, reason, {"signal": signal_name, "shards_left": shards_left})

    def clear_notes(self) -> None:
        """A new attempt starts: the last one's failure or interruption note no longer describes the output."""
        self._delete(self._at(FAILURE))
        self._delete(self._at(INTERRUPTED))

    def read_interrupted(self) -> dict[str, Any] | None:
        return self._read_json(INTERRUPTED)

    def read_failure(self) -> dict[str, Any] | None:
        return self._read_json(FAILURE)

    def read_summary(self) -> dict[str, Any] | None:
        return self._read_json(SUMMARY)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._write_json(SUMMARY, summary)
