"""One file API over local paths and s3:// URIs, with the atomic write the commit protocol relies on.

pyarrow's filesystems do the work (the same layer Ray Data reads with); an S3-compatible endpoint such as a test
server is taken from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, as boto3 does.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


@dataclass(frozen=True)
class Location:
    """A folder or file on a filesystem: `fs` plus a path in that filesystem's own form."""

    fs: pafs.FileSystem
    path: str
    uri: str

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def child(self, *parts: str) -> Location:
        path = "/".join([self.path.rstrip("/"), *parts])
        uri = "/".join([self.uri.rstrip("/"), *parts])
        return Location(self.fs, path, uri)


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


def locate(uri: str) -> Location:
    if uri.startswith("s3://"):
        path = uri[len("s3://") :].rstrip("/")
        if not path:
            raise StorageError(f"{uri}: an s3:// URI needs a bucket")
        return Location(_s3_filesystem(), path, uri.rstrip("/"))
    if "://" in uri:
        raise StorageError(f"{uri}: only local paths and s3:// URIs are supported")
    local = str(Path(uri).expanduser().resolve())
    return Location(pafs.LocalFileSystem(), local, local)


def exists(location: Location) -> bool:
    return location.fs.get_file_info(location.path).type != pafs.FileType.NotFound


def is_file(location: Location) -> bool:
    return location.fs.get_file_info(location.path).type == pafs.FileType.File


def list_files(location: Location) -> list[Location]:
    """Every file below a folder (recursively), sorted by path; a file lists as itself."""
    info = location.fs.get_file_info(location.path)
    if info.type == pafs.FileType.File:
        return [location]
    if info.type == pafs.FileType.NotFound:
        return []
    selector = pafs.FileSelector(location.path, recursive=True, allow_not_found=True)
    found = [i for i in location.fs.get_file_info(selector) if i.type == pafs.FileType.File]
    root = location.path.rstrip("/")
    return [location.child(i.path[len(root) + 1 :]) for i in sorted(found, key=lambda i: i.path)]


def read_bytes(location: Location) -> bytes:
    try:
        with location.fs.open_input_stream(location.path) as stream:
            return bytes(stream.read())
    except (OSError, FileNotFoundError) as error:
        raise StorageError(f"cannot read {location.uri}: {error}") from error


def write_bytes_atomic(location: Location, data: bytes) -> None:
    """Write so that a reader sees the whole file or none of it, even if the process dies mid-write.

    Local: write a temporary sibling, fsync, rename (atomic on POSIX). S3: one PUT, which S3 makes visible only
    when complete; a killed upload leaves nothing behind.
    """
    try:
        if location.is_s3:
            with location.fs.open_output_stream(location.path) as stream:
                stream.write(data)
            return
        target = Path(location.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as error:
        raise StorageError(f"cannot write {location.uri}: {error}") from error


def delete_file(location: Location) -> None:
    with contextlib.suppress(FileNotFoundError):
        location.fs.delete_file(location.path)


def delete_tree(location: Location) -> None:
    if location.fs.get_file_info(location.path).type == pafs.FileType.Directory:
        location.fs.delete_dir_contents(location.path, missing_dir_ok=True)
    for leftover in list_files(location):
        delete_file(leftover)
