"""The output layout and its commit protocol: every input row lands exactly once, across any number of attempts.

Layout under the output URI (<tag> is `g<generation>a<attempt>`, e.g. `g1a3`; outputs made before tags have none):
    results/part-<shard>.<tag>.parquet   committed results of one shard
    errors/part-<shard>.<tag>.jsonl      committed error records of one shard (only when it has any)
    _commits/shard-<shard>.<tag>.json    the commit marker: a shard exists for readers once its marker does
    _pending/...                         parts written before their marker; never read as results
    _failed.json                         the last attempt failed (why); removed when an attempt starts
    _interrupted.json                    the last attempt was stopped by SIGTERM; a rerun resumes
    _manifest.json                       what the output was made with (config hash, input, generation, attempts)
    _lease.json                          the live attempt's lease (workload/job/lease.py); absent between attempts
    summary.json                         written last, once every shard is committed
    output.jsonl, errors.jsonl           an OpenAI Batch input's answers in OpenAI's format, rebuilt from the commits

A shard commit writes its parts to _pending/ (each write atomic), then the marker (atomic), then moves the parts
into results/ and errors/. A run killed before the marker leaves only _pending/ files, which the next attempt
deletes; killed after it, the next attempt finishes the move (roll forward). So results/ never holds a row
of an uncommitted shard, on a local disk (rename) as on S3 (single-object PUT and copy, no rename needed).

The fence. Only the holder of the output's lease writes here: every write, move and delete first calls the store's
`guard` (the lease's `check`, a clock read). A process can still be paused (SIGSTOP, a VM freeze, a long GC)
between that check and its request, and wake after a successor took the lease; what it sends then must not change
anything the successor relies on. Three rules make every such request harmless:
- Names are unique to the attempt that writes them (the tag): a stale write creates a file no successor's marker
  names (swept by the next recover) and never replaces one.
- The manifest is replaced only conditionally (If-Match on the version this attempt last read or wrote; locally a
  compare-and-swap under flock), and every attempt writes it before any other change: a stale manifest write fails
  once a successor has started. A marker counts only if its generation is the manifest's (and, per shard, only the
  highest attempt's), so a stale marker of an older generation is never trusted.
- A reset (`--restart`) first moves the manifest to a new generation, and only then deletes files, and only files
  of older generations, which nobody trusts once that manifest exists. A reset paused mid-way and woken after a
  successor took over can only delete files the successor also ignores.
summary.json, the notes and the OpenAI files are also written and deleted only conditionally, on the version this
attempt saw. One found changed was changed by a stale attempt if this one still owns the manifest (it proves so by
rewriting it, conditionally): it is then replaced, so a stale summary or output.jsonl never outlives its successor.
A conditional write or delete whose reply is lost (a read timeout, a reset) is retried by the S3 client with the
same condition and finds this attempt's own change: storage recognises it by the nonce each write carries in the
object's metadata (and a delete by the file being gone), so a slow reply never reads as another attempt's write.
"""

from __future__ import annotations

import io
import json
import re
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
    WriteConflict,
    delete_file,
    delete_if,
    exists,
    is_temporary,
    list_files,
    locate,
    move,
    read_bytes,
    read_many,
    read_versioned,
    write_bytes_atomic,
    write_if,
)
from workload.job.lease import LeaseLostError

RESULTS = "results"
ERRORS = "errors"
COMMITS = "_commits"
PENDING = "_pending"
MANIFEST = "_manifest.json"
SUMMARY = "summary.json"
# What the nightly state machine watches for beside summary.json: the file's name says whether to retry.
FAILURE = "_failed.json"  # the attempt failed; retrying the same config will not help by itself
INTERRUPTED = "_interrupted.json"  # stopped by SIGTERM after committing what was finished: retry to resume
# An OpenAI Batch input's answers in OpenAI's format, derived from the commits (workload/job/openai_files.py).
OPENAI_FILES = ("output.jsonl", "errors.jsonl")
NOTES = (SUMMARY, FAILURE, INTERRUPTED, *OPENAI_FILES)


class OutputFencedError(LeaseLostError):
    """A conditional write of the output found another attempt's version: this one no longer owns the output."""


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
    files: list[str]  # paths relative to the output root, e.g. "results/part-000003.g0a1.parquet"
    error_types: dict[str, int]
    generation: int = 0  # the manifest's generation it was made in (0: before generations were recorded)
    cached_tokens: int = 0  # of input_tokens, vLLM's prefix-cache hits (0 in commits made before they were counted)
    reasoning_tokens: int = 0  # of output_tokens, the thinking a reasoning parser read apart (0 likewise)

    @classmethod
    def decode(cls, data: bytes) -> ShardCommit:
        value = json.loads(data)
        known = {name: value[name] for name in cls.__dataclass_fields__ if name in value}
        return cls(**known)


def _tag(generation: int, attempt: int) -> str:
    return f"g{generation}a{attempt}"


def _part_name(shard: int, folder: str, tag: str) -> str:
    extension = "parquet" if folder == RESULTS else "jsonl"
    return f"{folder}/part-{shard:06d}.{tag}.{extension}"


def _marker_name(shard: int, tag: str) -> str:
    return f"{COMMITS}/shard-{shard:06d}.{tag}.json"


def _shard_of(name: str) -> int | None:
    stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
    _, _, number = stem.rpartition("-")
    return int(number) if number.isdigit() else None


_TAG = re.compile(r"\.g(\d+)a(\d+)\.")


def _generation_of(name: str) -> int:
    """The generation a file was written in, from its tag; untagged files (made before tags) are generation 0."""
    found = _TAG.search(name.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else 0


def _no_guard() -> None:
    pass


_UNREAD = "<unread>"


class OutputStore:
    def __init__(self, uri: str, guard: Callable[[], None] = _no_guard) -> None:
        self.root: Location = locate(uri)
        self._guard = guard  # raises when this process may no longer change the output (its lease is lost)
        self.generation = 0  # the manifest's; set by read_manifest and reset
        # Shards whose marker names files found neither published nor pending: redone, and their stale files
        # replaced, by this attempt (filled by `recover`).
        self.untrusted: dict[int, list[str]] = {}
        self._replaced: dict[int, list[str]] = {}  # an untrusted commit's marker and surviving files, per shard
        # The version of each conditionally written file as this attempt last saw it (None: absent).
        self._versions: dict[str, str | None] = {}
        self._manifest: dict[str, Any] | None = None  # as this attempt last wrote it (None: not written yet)

    def _at(self, relative: str) -> Location:
        return self.root.child(*relative.split("/"))

    # Every change to the output goes through these, behind the guard.
    def _write(self, location: Location, data: bytes, metadata: dict[str, str] | None = None) -> None:
        self._guard()
        write_bytes_atomic(location, data, metadata)

    def _delete(self, location: Location) -> None:
        self._guard()
        delete_file(location)

    def _move(self, source: Location, target: Location) -> None:
        self._guard()
        move(source, target, before_delete=self._guard)

    def _seen(self, relative: str) -> str | None:
        if self._versions.get(relative, _UNREAD) == _UNREAD:
            current = read_versioned(self._at(relative))
            self._versions[relative] = current[1] if current else None
        return self._versions[relative]

    def _write_fenced(self, relative: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """Replace a file only if it is still the version this attempt saw: a stale attempt's write fails.

        A file other than the manifest found changed is replaced all the same once this attempt has proved it
        still owns the output (`_still_owner`): then whoever changed it was a stale attempt."""
        expected = self._seen(relative)
        self._guard()
        try:
            self._versions[relative] = write_if(self._at(relative), data, expected, metadata)
            return
        except WriteConflict as error:
            if relative == MANIFEST:
                raise OutputFencedError(f"{self._at(relative).uri} was changed by another attempt: {error}") from error
            self._still_owner(relative, error)
        self._refresh(relative)
        try:
            self._versions[relative] = write_if(self._at(relative), data, self._versions[relative], metadata)
        except WriteConflict as error:
            raise OutputFencedError(f"{self._at(relative).uri} was changed by another attempt: {error}") from error

    def _delete_fenced(self, relative: str) -> None:
        expected = self._seen(relative)
        if expected is None:
            self._refresh(relative)  # absent when this attempt looked; a stale attempt may have written it since
            expected = self._versions[relative]
            if expected is None:
                return
            # Someone wrote it since: only the output's owner may take it away (a stale attempt must not delete
            # its successor's note).
            self._still_owner(relative, WriteConflict(f"{self._at(relative).uri} appeared since this attempt looked"))
        self._guard()
        try:
            delete_if(self._at(relative), expected)
        except WriteConflict as error:
            self._still_owner(relative, error)
            self._refresh(relative)
            current = self._versions[relative]
            try:
                if current is not None:
                    delete_if(self._at(relative), current)
            except WriteConflict as again:
                raise OutputFencedError(f"{self._at(relative).uri} was changed by another attempt: {again}") from again
        self._versions[relative] = None

    def _refresh(self, relative: str) -> None:
        current = read_versioned(self._at(relative))
        self._versions[relative] = current[1] if current else None

    def _still_owner(self, relative: str, error: WriteConflict) -> None:
        """Prove this attempt still owns the output by rewriting its manifest (conditional on the version it
        wrote): OutputFencedError if a successor has started. If it has not, the file `relative` was changed by
        a stale attempt (one that read it before this attempt started and woke after), which this one replaces:
        the fence's rule that the attempt holding the manifest wins, for the files it derives as for the rest."""
        if self._manifest is None:
            raise OutputFencedError(f"{self._at(relative).uri} was changed by another attempt: {error}") from error
        self.write_manifest(self._manifest)
        print(
            f"[llm-batch] {self._at(relative).uri} was written by a stale attempt; this attempt replaces it",
            file=sys.stderr,
        )

    def read_part(self, relative: str) -> bytes | None:
        """A committed part (`ShardCommit.files`), or None where the shard has none of that kind."""
        location = self._at(relative)
        return read_bytes(location) if exists(location) else None

    def write_file(self, name: str, data: bytes) -> None:
        """A file the run derives from its commits (the OpenAI Batch output files): fenced like the notes, so a
        stale attempt cannot replace what its successor wrote."""
        self._write_fenced(name, data)

    def _read_json(self, relative: str) -> dict[str, Any] | None:
        current = read_versioned(self._at(relative))
        self._versions[relative] = current[1] if current else None
        if current is None:
            return None
        value = json.loads(current[0])
        return value if isinstance(value, dict) else None

    def _encode(self, value: dict[str, Any]) -> bytes:
        return json.dumps(value, indent=2, sort_keys=True).encode()

    # --- run identity -------------------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any] | None:
        manifest = self._read_json(MANIFEST)
        self.generation = int(manifest.get("generation", 0)) if manifest else 0
        for name in NOTES:
            self._seen(name)
        return manifest

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Conditional on the version read or written last: the attempt's fencing token (see the module doc)."""
        self._write_fenced(MANIFEST, self._encode(manifest))
        self._manifest = manifest

    def reset(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Retire everything the job wrote here (an explicit restart) and return `manifest` as the new generation's.

        The new manifest is written first; only then are files of older generations deleted, one by one behind
        the guard. Nothing else below the URI is touched."""
        listed = [f for folder in (RESULTS, ERRORS, COMMITS, PENDING) for f in list_files(self._at(folder))]
        newest = max([self.generation, *(_generation_of(f.path) for f in listed)])
        fresh = {**manifest, "generation": newest + 1}
        self.write_manifest(fresh)
        self.generation = newest + 1
        for name in NOTES:
            self._delete_fenced(name)
        for folder in (RESULTS, ERRORS, COMMITS, PENDING):
            for file in list_files(self._at(folder)):
                if _generation_of(file.path) != self.generation:
                    self._delete(file)
        return fresh

    # --- shards -------------------------------------------------------------------------------------------
    def _markers(self) -> list[tuple[str, ShardCommit]]:
        """Every commit marker of any generation, listed once and read in parallel (an output of thousands of
        shards reopens in seconds). Temporary files and unreadable markers are left out (and reported)."""
        found = [f for f in list_files(self._at(COMMITS)) if not is_temporary(f) and f.path.endswith(".json")]
        markers = []
        for location, data in zip(found, read_many(found), strict=True):
            try:
                markers.append((self._relative(location), ShardCommit.decode(data)))
            except (ValueError, TypeError) as error:
                print(f"[llm-batch] {location.uri} is not a commit marker ({error}); ignored", file=sys.stderr)
        return markers

    def _winners(self) -> dict[int, tuple[str, ShardCommit]]:
        """Per shard, the marker that counts: this generation's, of the highest attempt."""
        winners: dict[int, tuple[str, ShardCommit]] = {}
        for name, commit in self._markers():
            if commit.generation != self.generation:
                continue
            best = winners.get(commit.shard)
            if best is None or commit.attempt > best[1].attempt:
                winners[commit.shard] = (name, commit)
        return winners

    def committed(self) -> dict[int, ShardCommit]:
        return {shard: commit for shard, (_, commit) in self._winners().items()}

    def _relative(self, location: Location) -> str:
        return location.uri[len(self.root.uri) + 1 :]

    def recover(self) -> dict[int, ShardCommit]:
        """Finish what a killed attempt left: roll committed shards forward, delete what no marker that counts names.

        Returns the shards that are committed and whole. A marker whose files are neither published nor pending
        is reported and not trusted: its shard is redone, and the marker and its surviving files stay until the
        redo replaces them. Markers of older generations, markers superseded by a later attempt's, parts no
        counting marker names and temporary files are deleted.
        """
        winners = self._winners()
        pending = {self._relative(f)[len(PENDING) + 1 :] for f in list_files(self._at(PENDING))}
        published = {self._relative(f) for folder in (RESULTS, ERRORS) for f in list_files(self._at(folder))}
        self.untrusted, self._replaced = {}, {}
        keep: set[str] = set()
        for number, (marker, commit) in winners.items():
            keep.add(marker)
            missing = [name for name in commit.files if name not in pending and name not in published]
            if missing:
                self.untrusted[number] = missing
                self._replaced[number] = [marker, *(n for n in commit.files if n not in missing)]
                keep.update(commit.files)
                print(
                    f"[llm-batch] shard {number}: its marker names {', '.join(missing)}, found neither published "
                    "nor pending; not trusted, the shard is redone",
                    file=sys.stderr,
                )
                continue
            for name in commit.files:
                keep.add(name)
                if name in pending:
                    # On S3 a move is copy + delete; a kill between the two is finished by the next recover().
                    self._move(self._at(f"{PENDING}/{name}"), self._at(name))
        for folder in (COMMITS, PENDING, RESULTS, ERRORS):
            for part in list_files(self._at(folder)):
                relative = self._relative(part)
                if folder == PENDING:
                    relative = relative[len(PENDING) + 1 :]
                if is_temporary(part) or relative not in keep or _shard_of(relative) is None:
                    self._delete(part)
        return {shard: commit for shard, (_, commit) in winners.items() if shard not in self.untrusted}

    def _publish(self, commit: ShardCommit, marker: str) -> None:
        for relative in commit.files:
            pending = self._at(f"{PENDING}/{relative}")
            if exists(pending):
                self._move(pending, self._at(relative))
        # The shard was redone: the old commit's marker and surviving parts would show its rows twice.
        for name in self._replaced.pop(commit.shard, []):
            if name != marker and name not in commit.files:
                self._delete(self._at(name))
        self.untrusted.pop(commit.shard, None)

    def commit_shard(
        self,
        shard: int,
        results: pa.Table | None,
        errors: list[dict[str, Any]],
        stats: dict[str, Any],
        attempt: int,
    ) -> ShardCommit:
        tag = _tag(self.generation, attempt)
        files: list[str] = []
        if results is not None and results.num_rows:
            buffer = io.BytesIO()
            pq.write_table(results, buffer, compression="zstd")
            name = _part_name(shard, RESULTS, tag)
            self._write(self._at(f"{PENDING}/{name}"), buffer.getvalue())
            files.append(name)
        if errors:
            name = _part_name(shard, ERRORS, tag)
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
            generation=self.generation,
            # Stats without the count (a caller that commits hand-made shards) read as commits made before it.
            cached_tokens=int(stats.get("cached_tokens", 0)),
            reasoning_tokens=int(stats.get("reasoning_tokens", 0)),
        )
        marker = _marker_name(shard, tag)
        self._write(self._at(marker), self._encode(asdict(commit)))
        failpoints.reached(failpoints.SHARD_COMMITTED)
        self._publish(commit, marker)
        return commit

    # --- the end ------------------------------------------------------------------------------------------
    def _write_note(self, name: str, reason: str, extra: dict[str, Any]) -> None:
        # The reason also travels as S3 metadata (ASCII, short), which a Step Functions state can read without
        # fetching the object's body.
        short = reason.encode("ascii", "replace").decode()[:900]
        body = {"reason": reason, **extra, "at": utc_now()}
        self._write_fenced(name, self._encode(body), metadata={"reason": short})

    def write_failure(self, error_type: str, message: str) -> None:
        reason = f"{error_type}: {message}"
        self._write_note(FAILURE, reason, {"error_type": error_type, "error_message": message})

    def write_interrupted(self, signal_name: str, shards_left: int | None) -> None:
        """`shards_left` is None when the stop came before the id pass counted the input (nothing ran yet)."""
        left = "the whole input" if shards_left is None else f"{shards_left} shard(s)"
        reason = f"stopped by {signal_name} with {left} left; a rerun resumes"
        self._write_note(INTERRUPTED, reason, {"signal": signal_name, "shards_left": shards_left})

    def clear_notes(self) -> None:
        """A new attempt starts: the last one's failure or interruption note no longer describes the output."""
        self._delete_fenced(FAILURE)
        self._delete_fenced(INTERRUPTED)

    def clear_summary(self) -> None:
        """A pool's folder at a new run (workload/job/pool.py): the last run's summary no longer describes it."""
        self._delete_fenced(SUMMARY)

    def read_interrupted(self) -> dict[str, Any] | None:
        return self._read_json(INTERRUPTED)

    def read_failure(self) -> dict[str, Any] | None:
        return self._read_json(FAILURE)

    def read_summary(self) -> dict[str, Any] | None:
        return self._read_json(SUMMARY)

    def write_summary(self, summary: dict[str, Any]) -> None:
        # A note a stale attempt left since this one started would contradict the summary: gone first, so a
        # reader that finds summary.json finds no failure or interruption beside it.
        self.clear_notes()
        self._write_fenced(SUMMARY, self._encode({**summary, "generation": self.generation}))
