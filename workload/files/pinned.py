"""Input reads pinned to the plan: a file is read as the plan listed it (its size and content version) or not at all.

The plan fixes every row's position from each file's record count, so a file that changes after the plan shifts
rows into other rows' places. Every read of an input file therefore goes through here:

- S3: the object is read through boto3 with `If-Match: <the planned ETag>` on every request (one streamed GET for
  JSONL, ranged GETs for Parquet's random access). S3 answers each GET from one version of the object, so the
  bytes are the planned ones or the request fails with 412 and nothing of the new version is ever read.
- Local: the file's size and modification time are compared with the plan's when it is opened and again when its
  last planned byte has been read; reads stop at the planned size, so rows appended later are never read. (The
  driver also compares them before each commit: workload/job/committer.py.)

A change raises InputChangedError naming the file; the job stops with exit code 3 and commits nothing more.

The version pins a read within an attempt; it is not the input's identity across attempts. An ETag is the MD5 of
the bytes only for a single-part PUT stored plaintext or with SSE-S3: with SSE-KMS (this stack's buckets) or a
multipart upload (`aws s3 cp` of a large file; ETag "<md5 of the parts' md5s>-<parts>") it is not (the S3 API
Reference's Object.ETag, as quoted in iterate-ch/cyberduck#10371 and aptly-dev/aptly#1117, read 2026-12-06), so
an identical re-upload can get another ETag; a local copy gets another modification time. So a stream also
hashes what it reads (`PinnedStream.digest`, `content_digest`): the sha256 of the planned bytes is what a resume
compares (workload/job/input_plan.py, `hash_moved_files` and `input_changes`).
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

from workload.files.storage import Location, StorageError, s3_client

EXIT_INPUT_CHANGED = 3


class InputChangedError(StorageError):
    """An input file is not what the plan listed: changed, grown or removed since."""

    exit_code = EXIT_INPUT_CHANGED


def changed(uri: str, what: str) -> InputChangedError:
    return InputChangedError(
        f"{uri} changed during the attempt ({what}); nothing read from the changed file is committed. "
        "Upload input before the run starts (see docs/resume.md, the _READY marker), then rerun."
    )


def local_version(path: str) -> tuple[int, str]:
    stat = os.stat(path)
    return stat.st_size, f"mtime_ns:{stat.st_mtime_ns}"


def _etag(version: str) -> str:
    if not version.startswith("etag:"):
        raise ValueError(f"not an S3 content version: {version!r}")
    return f'"{version.removeprefix("etag:")}"'


def _s3_get(location: Location, version: str, byte_range: str | None = None) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    kwargs: dict[str, str] = {"IfMatch": _etag(version)}
    if byte_range is not None:
        kwargs["Range"] = byte_range
    try:
        return s3_client().get_object(Bucket=location.bucket, Key=location.key, **kwargs)
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in {"PreconditionFailed", "412"}:
            raise changed(location.uri, "its ETag is no longer the planned one") from error
        if code in {"NoSuchKey", "404", "NotFound"}:
            raise changed(location.uri, "removed") from error
        raise StorageError(f"cannot read {location.uri}: {error}") from error
    except BotoCoreError as error:
        raise StorageError(f"cannot read {location.uri}: {error}") from error


class PinnedStream(io.RawIOBase):
    """The planned bytes of one file, read front to back (JSONL)."""

    def __init__(self, location: Location, size: int, version: str) -> None:
        super().__init__()
        self.location, self.size, self.version = location, size, version
        self._left = size
        self._hash = hashlib.sha256()
        self._body: Any = None
        self._local: Any = None
        if location.is_s3:
            self._body = _s3_get(location, version)["Body"]
        else:
            self._local = open(location.path, "rb")  # noqa: SIM115 (closed in close())
            self._check_local("when opened")

    def _check_local(self, when: str) -> None:
        stat = os.fstat(self._local.fileno())
        now = (stat.st_size, f"mtime_ns:{stat.st_mtime_ns}")
        if now != (self.size, self.version):
            what = "size" if now[0] != self.size else "modification time"
            raise changed(self.location.uri, f"{what} differs from the plan {when}")

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        want = self._left if n is None or n < 0 else min(n, self._left)
        if want <= 0:
            if self._local is not None and self._left == 0:
                self._check_local("after its last planned byte")
                self._left = -1  # checked once
            return b""
        source = self._body if self._body is not None else self._local
        data = bytes(source.read(want))
        if not data:
            raise changed(self.location.uri, f"it ended {self._left} bytes before its planned size")
        self._left -= len(data)
        self._hash.update(data)
        return data

    @property
    def digest(self) -> str | None:
        """The sha256 of the planned bytes once every one of them has been read; None before."""
        return f"sha256:{self._hash.hexdigest()}" if self._left <= 0 else None

    def close(self) -> None:
        for handle in (self._body, self._local):
            if handle is not None:
                handle.close()
        super().close()


class PinnedRandomAccess(io.RawIOBase):
    """The planned bytes of one file, with seek (Parquet): on S3 each read is a ranged GET with If-Match."""

    def __init__(self, location: Location, size: int, version: str) -> None:
        super().__init__()
        self.location, self.size, self.version = location, size, version
        self._position = 0
        self._local: Any = None
        if not location.is_s3:
            self._local = open(location.path, "rb")  # noqa: SIM115 (closed in close())
            stat = os.fstat(self._local.fileno())
            if (stat.st_size, f"mtime_ns:{stat.st_mtime_ns}") != (size, version):
                raise changed(location.uri, "size or modification time differs from the plan when opened")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._position + n)
        if end <= self._position:
            return b""
        if self._local is not None:
            self._local.seek(self._position)
            data = bytes(self._local.read(end - self._position))
        else:
            body = _s3_get(self.location, self.version, f"bytes={self._position}-{end - 1}")["Body"]
            data = bytes(body.read())
        self._position += len(data)
        return data

    def close(self) -> None:
        if self._local is not None:
            if not self.closed and local_version(self.location.path) != (self.size, self.version):
                self._local.close()
                super().close()
                raise changed(self.location.uri, "size or modification time differs from the plan after its read")
            self._local.close()
        super().close()


def open_pinned(location: Location, size: int, version: str, random_access: bool = False) -> Any:
    if random_access:
        return PinnedRandomAccess(location, size, version)
    return PinnedStream(location, size, version)


def content_digest(location: Location, size: int, version: str) -> str:
    """The sha256 of the file's planned bytes, read front to back pinned to `version` (as the id pass hashes them)."""
    with PinnedStream(location, size, version) as stream:
        while stream.read(DIGEST_CHUNK):
            pass
        # Every planned byte was read: read() raises when the file ends before its planned size.
        return str(stream.digest)


DIGEST_CHUNK = 4 << 20


def current_version(location: Location) -> tuple[int, str] | None:
    """Size and version now, None when the file is gone (local only: S3 reads carry their own condition)."""
    try:
        return local_version(location.path)
    except FileNotFoundError:
        return None
