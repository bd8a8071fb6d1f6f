"""One file API over local paths and s3:// URIs, with the atomic write and move the commit protocol relies on.

Local files go through the OS (temp file + rename). S3 goes through boto3, object by object: a PUT is atomic, a
server-side copy moves data without downloading it, and nothing creates the "directory marker" objects that
filesystem layers over S3 leave behind. An S3-compatible endpoint (a test server) comes from AWS_ENDPOINT_URL or
AWS_ENDPOINT_URL_S3, which boto3 reads itself. Parquet input is read with pyarrow, through `Location.fs`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


class WriteConflict(StorageError):
    """A conditional write or delete found the file not in the state it expected (someone else changed it)."""


# Every S3 call ends, one way or another, within S3_CALL_BOUND_S: three tries at most, each given 2 s to connect and
# 6 s per socket read, with standard-mode backoff between (at most 1 s, then 2 s). The output lease stops its
# holder a quarter of its TTL before expiry (30 s at the default 120 s), so a call that passed the lease check is
# answered or abandoned before a successor may take over. The fence does not rest on this bound (a paused process
# ignores every timeout): see workload/job/output.py. It keeps the common case, a slow network, out of that path.
S3_CONNECT_TIMEOUT_S = 2.0
S3_READ_TIMEOUT_S = 6.0
S3_MAX_ATTEMPTS = 3
S3_CALL_BOUND_S = S3_MAX_ATTEMPTS * (S3_CONNECT_TIMEOUT_S + S3_READ_TIMEOUT_S) + 1.0 + 2.0


def s3_client_config() -> Any:
    from botocore.config import Config

    return Config(
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
        retries={"total_max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
    )


@cache
def s3_client() -> Any:
    """The process's one S3 client (its connection pool shared by every read and listing)."""
    import boto3

    return boto3.client("s3", config=s3_client_config())


def is_temporary(location: Location) -> bool:
    """A file this module (or a tool like it) writes before renaming it into place: never a result or a marker."""
    name = location.path.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(".tmp")


def _s3_filesystem() -> pafs.S3FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    kwargs: dict[str, object] = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)


@dataclass(frozen=True)
class Location:
    """A file or folder: a local path, or a bucket and key. `path` is the form pyarrow filesystems take."""

    uri: str

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    @property
    def path(self) -> str:
        return self.uri[len("s3://") :] if self.is_s3 else self.uri

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def key(self) -> str:
        return self.path.split("/", 1)[1] if "/" in self.path else ""

    @property
    def fs(self) -> pafs.FileSystem:
        return _s3_filesystem() if self.is_s3 else pafs.LocalFileSystem()

    def child(self, *parts: str) -> Location:
        return Location("/".join([self.uri.rstrip("/"), *parts]))


def locate(uri: str) -> Location:
    if uri.startswith("s3://"):
        if not uri[len("s3://") :].strip("/"):
            raise StorageError(f"{uri}: an s3:// URI needs a bucket")
        return Location(uri.rstrip("/"))
    if "://" in uri:
        raise StorageError(f"{uri}: only local paths and s3:// URIs are supported")
    return Location(str(Path(uri).expanduser().resolve()))


def _s3_error(action: str, location: Location, error: Exception) -> StorageError:
    return StorageError(f"cannot {action} {location.uri}: {error}")


def exists(location: Location) -> bool:
    if not location.is_s3:
        return Path(location.path).is_file()
    from botocore.exceptions import ClientError

    try:
        s3_client().head_object(Bucket=location.bucket, Key=location.key)
        return True
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return False
        raise _s3_error("check", location, error) from error


def list_files(location: Location) -> list[Location]:
    """Every file below a folder or prefix (recursively), sorted; a file lists as itself."""
    if not location.is_s3:
        root = Path(location.path)
        if root.is_file():
            return [location]
        if not root.is_dir():
            return []
        return [Location(str(p)) for p in sorted(root.rglob("*")) if p.is_file()]
    from botocore.exceptions import BotoCoreError, ClientError

    prefix = location.key
    try:
        pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix)
        keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    except (BotoCoreError, ClientError) as error:
        raise _s3_error("list", location, error) from error
    if prefix in keys:
        return [location]
    # "in/" and "in" name the same folder; "input2/x" is not below "input".
    folder = prefix.rstrip("/") + "/" if prefix else ""
    return [Location(f"s3://{location.bucket}/{k}") for k in sorted(keys) if k.startswith(folder) and k[-1] != "/"]


def list_versions(uri: str) -> list[tuple[Location, int, str]]:
    """`list_files` with each file's size and content version (see `content_version`), from the listing itself:
    no request per file, so tens of thousands of files list in a few pages."""
    location = locate(uri)
    if not location.is_s3:
        found = []
        for file in list_files(location):
            stat = Path(file.path).stat()
            found.append((file, stat.st_size, f"mtime_ns:{stat.st_mtime_ns}"))
        return found
    from botocore.exceptions import BotoCoreError, ClientError

    prefix = location.key
    try:
        pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix)
        objects = {obj["Key"]: obj for page in pages for obj in page.get("Contents", [])}
    except (BotoCoreError, ClientError) as error:
        raise _s3_error("list", location, error) from error
    if prefix in objects:
        keys = [prefix]
    else:
        folder = prefix.rstrip("/") + "/" if prefix else ""
        keys = [k for k in sorted(objects) if k.startswith(folder) and k[-1] != "/"]
    return [
        (
            Location(f"s3://{location.bucket}/{key}"),
            int(objects[key]["Size"]),
            f"etag:{objects[key]['ETag'].strip(chr(34))}",
        )
        for key in keys
    ]


def read_many(locations: list[Location], threads: int = 32) -> list[bytes]:
    """Read many small files at once (S3 requests wait on the network, not on each other); in order."""
    if len(locations) <= 1:
        return [read_bytes(location) for location in locations]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(threads, len(locations))) as pool:
        return list(pool.map(read_bytes, locations))


def size_of(location: Location) -> int:
    if not location.is_s3:
        return Path(location.path).stat().st_size
    return int(s3_client().head_object(Bucket=location.bucket, Key=location.key)["ContentLength"])


def content_version(location: Location) -> tuple[int, str]:
    """Size and a version that changes when the content does: the ETag on S3, the modification time in nanoseconds
    locally. Not the content's identity: an identical re-upload can get another ETag (SSE-KMS, multipart uploads)
    and a copy another time; the job's resume compares the sha256 of the bytes (workload/files/pinned.py)."""
    if not location.is_s3:
        stat = Path(location.path).stat()
        return stat.st_size, f"mtime_ns:{stat.st_mtime_ns}"
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        head = s3_client().head_object(Bucket=location.bucket, Key=location.key)
    except (BotoCoreError, ClientError) as error:
        raise _s3_error("check", location, error) from error
    return int(head["ContentLength"]), f"etag:{head['ETag'].strip(chr(34))}"


def read_bytes(location: Location) -> bytes:
    try:
        if not location.is_s3:
            return Path(location.path).read_bytes()
        return bytes(s3_client().get_object(Bucket=location.bucket, Key=location.key)["Body"].read())
    except Exception as error:
        raise _s3_error("read", location, error) from error


def write_bytes_atomic(location: Location, data: bytes, metadata: dict[str, str] | None = None) -> None:
    """Write so that a reader sees the whole file or none of it, even if the process dies mid-write.

    Local: a temporary sibling, fsync, rename (atomic on POSIX). S3: one PUT, which S3 shows only when complete;
    `metadata` becomes the object's user metadata there (readers that cannot fetch bodies can still see it).
    """
    try:
        if location.is_s3:
            s3_client().put_object(Bucket=location.bucket, Key=location.key, Body=data, Metadata=metadata or {})
            return
        target = Path(location.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:
            # A full disk fails the write or the fsync: the half-written temporary is not left for a reader.
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
    except Exception as error:
        raise _s3_error("write", location, error) from error


def move(source: Location, target: Location, before_delete: Callable[[], None] | None = None) -> None:
    """Move one file; the target appears whole. Local: rename. S3: server-side copy, then delete the source;
    `before_delete` runs between the two requests (the output lease's check)."""
    try:
        if source.is_s3:
            copy_source = {"Bucket": source.bucket, "Key": source.key}
            s3_client().copy_object(Bucket=target.bucket, Key=target.key, CopySource=copy_source)
        else:
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(source.path, target.path)
            return
    except Exception as error:
        raise _s3_error("move", source, error) from error
    if before_delete is not None:
        before_delete()  # its own error (a lost lease) passes as it is
    delete_file(source)


def delete_file(location: Location) -> None:
    if location.is_s3:
        s3_client().delete_object(Bucket=location.bucket, Key=location.key)  # no error when absent
        return
    with contextlib.suppress(FileNotFoundError):
        Path(location.path).unlink()


# --- compare-and-swap on one small file (the output lease) -----------------------------------------------------
# S3: conditional requests (If-None-Match: * to create, If-Match: <ETag> to replace or delete); the version is
# the ETag. Local: a hash of the content is the version, and every check-then-write runs under an flock on a
# hidden sibling file, which the kernel releases when the process dies, so a crash never leaves it locked.


def _precondition_failed(error: Exception) -> bool:
    code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
    # 412: the condition failed; 409: a concurrent conditional write won; 404: an If-Match target is gone.
    return code in {"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"}


def _local_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


@contextlib.contextmanager
def _local_lock(target: Path) -> Iterator[None]:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_versioned(location: Location) -> tuple[bytes, str] | None:
    """The file's bytes and version, or None when it does not exist."""
    if not location.is_s3:
        try:
            data = Path(location.path).read_bytes()
        except FileNotFoundError:
            return None
        return data, _local_version(data)
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = s3_client().get_object(Bucket=location.bucket, Key=location.key)
        return bytes(response["Body"].read()), str(response["ETag"])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return None
        raise _s3_error("read", location, error) from error
    except BotoCoreError as error:
        raise _s3_error("read", location, error) from error


def _local_write_new(target: Path, data: bytes) -> None:
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_bytes(data)
    try:
        os.link(temporary, target)  # atomic, and fails if the target exists: an exclusive create of a whole file
    finally:
        temporary.unlink()


# Each conditional write carries a nonce of its own in the object's metadata. A reply lost on the way back (a read
# timeout, a connection reset) makes botocore send the same request again with the same condition, and that retry
# finds the state its own first try made: a 412. The nonce tells that apart from another writer's change.
WRITE_ID = "llm-batch-write-id"


def _own_version(location: Location, write_id: str) -> str | None:
    """The object's ETag if it is the write that carried `write_id` (applied, its reply lost), else None."""
    from botocore.exceptions import ClientError

    try:
        head = s3_client().head_object(Bucket=location.bucket, Key=location.key)
    except ClientError:
        return None
    return str(head["ETag"]) if head.get("Metadata", {}).get(WRITE_ID) == write_id else None


def write_if(location: Location, data: bytes, version: str | None, metadata: dict[str, str] | None = None) -> str:
    """Write only if the file is still at `version` (None: only if it does not exist); returns the new version.
    `metadata`: the object's user metadata on S3.

    Raises WriteConflict when the condition fails, unless what is stored is this very write (see WRITE_ID)."""
    if location.is_s3:
        from botocore.exceptions import BotoCoreError, ClientError

        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        write_id = uuid.uuid4().hex
        try:
            response = s3_client().put_object(
                Bucket=location.bucket,
                Key=location.key,
                Body=data,
                Metadata={**(metadata or {}), WRITE_ID: write_id},
                **condition,
            )
        except ClientError as error:
            if _precondition_failed(error):
                own = _own_version(location, write_id)
                if own is not None:
                    return own
                raise WriteConflict(f"{location.uri} changed under a conditional write: {error}") from error
            raise _s3_error("write", location, error) from error
        except BotoCoreError as error:
            raise _s3_error("write", location, error) from error
        return str(response["ETag"])
    target = Path(location.path)
    with _local_lock(target):
        current = read_versioned(location)
        if (current[1] if current else None) != version:
            raise WriteConflict(f"{location.uri} changed under a conditional write")
        if version is None:
            try:
                _local_write_new(target, data)
            except FileExistsError as error:
                raise WriteConflict(f"{location.uri} was created by someone else") from error
        else:
            write_bytes_atomic(location, data)
    return _local_version(data)


def delete_if(location: Location, version: str) -> None:
    """Delete only if the file is still at `version`; raises WriteConflict if it holds another version.

    A file already gone counts as deleted: a retried delete whose first try applied (its reply lost) finds nothing,
    and nothing anyone else wrote is lost by calling that success."""
    if location.is_s3:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3_client().delete_object(Bucket=location.bucket, Key=location.key, IfMatch=version)
        except ClientError as error:
            if _precondition_failed(error):
                if not exists(location):
                    return  # gone: our own delete whose reply was lost and was retried, or one that came first
                raise WriteConflict(f"{location.uri} changed under a conditional delete: {error}") from error
            raise _s3_error("delete", location, error) from error
        except BotoCoreError as error:
            raise _s3_error("delete", location, error) from error
        return
    target = Path(location.path)
    with _local_lock(target):
        current = read_versioned(location)
        if current is None:
            return
        if current[1] != version:
            raise WriteConflict(f"{location.uri} changed under a conditional delete")
        target.unlink()
