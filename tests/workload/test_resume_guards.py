"""A rerun against input re-uploaded with the same bytes resumes, and one against input edited in place (same size,
one byte changed) is refused naming the file and both digests, through the CLI as the image runs it, on local files
and on a real S3-speaking server. (A live lease refusing `run` and `--restart` is shown with the real job in
test_lease_e2e.py.)

No engine starts here: the input holds only rows that fail validation, whose shards commit without one.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.workload.jobrun import run_job, write_config
from workload.files.storage import list_files, locate, read_bytes, write_bytes_atomic

EXIT_OUTPUT_MISMATCH = 3


@dataclass
class Case:
    input_uri: str
    output_uri: str
    write_input: Callable[[bytes], None]
    # The same bytes uploaded again as an uploader re-running its copy would: a new version (ETag, mtime) each time.
    upload_again: Callable[[bytes], None]


@pytest.fixture(params=["local", "s3"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    if request.param == "local":
        source = tmp_path / "in" / "rows.jsonl"
        source.parent.mkdir()

        def copy_again(body: bytes) -> None:
            before = source.stat().st_mtime_ns
            source.write_bytes(body)
            os.utime(source, ns=(before, before + 1_000_000_000))  # a copy a second later, whatever the clock's grain

        yield Case(str(source.parent), str(tmp_path / "out"), source.write_bytes, copy_again)
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"guards-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)

    def write(body: bytes) -> None:
        s3.put_object(Bucket=bucket, Key="in/rows.jsonl", Body=body)

    def upload_again(body: bytes) -> None:
        """moto keeps MD5 ETags for a plain PUT, even of an SSE-KMS object, so identical bytes would keep theirs;
        AWS gives an SSE-KMS object an ETag that is not the bytes' MD5. A multipart upload's ETag is not the MD5 on
        moto either ("<md5 of the parts' md5s>-1"): the same bytes under another ETag, as AWS would give them."""
        before = s3.head_object(Bucket=bucket, Key="in/rows.jsonl")["ETag"]
        upload = s3.create_multipart_upload(Bucket=bucket, Key="in/rows.jsonl")["UploadId"]
        part = s3.upload_part(Bucket=bucket, Key="in/rows.jsonl", UploadId=upload, PartNumber=1, Body=body)
        parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
        s3.complete_multipart_upload(Bucket=bucket, Key="in/rows.jsonl", UploadId=upload, MultipartUpload=parts)
        after = s3.head_object(Bucket=bucket, Key="in/rows.jsonl")["ETag"]
        assert after != before and after.strip('"').endswith("-1"), (before, after)

    yield Case(f"s3://{bucket}/in/", f"s3://{bucket}/out", write, upload_again)


# Rows without a prompt: each is recorded as an error, and a shard of only such rows commits without an engine.
ORIGINAL = b'{"id": "a-1"}\n{"id": "a-2"}\n{"id": "a-3"}\n'
EDITED = ORIGINAL.replace(b"a-3", b"a-4")  # one byte changed


def _snapshot(uri: str) -> dict[str, bytes]:
    root = locate(uri)
    return {f.uri: read_bytes(f) for f in list_files(root)}


def _input_entry(output_uri: str) -> dict[str, object]:
    manifest = json.loads(read_bytes(locate(output_uri.rstrip("/") + "/_manifest.json")))
    [entry] = manifest["input_files"].values()
    return dict(entry)


def _sha256(body: bytes) -> str:
    return f"sha256:{hashlib.sha256(body).hexdigest()}"


def test_identical_reupload_resumes_and_an_edit_in_place_is_refused_naming_the_file(case: Case, tmp_path: Path) -> None:
    """Issue 59, finding 2: the input's identity is the sha256 of its bytes, which the id pass takes of what it
    reads; the version (ETag, modification time) only pins reads within an attempt."""
    case.write_input(ORIGINAL)
    config = write_config(tmp_path / "job.yaml", case.input_uri, case.output_uri, tmp_path / "models")
    code, log = run_job(["run", "--config", str(config)], timeout=120)
    assert code == 0, log
    first = _input_entry(case.output_uri)
    assert first["digest"] == _sha256(ORIGINAL), first

    # The same bytes again under a new version (the Spot-interrupted uploader re-running its copy): the rerun
    # hashes the file, finds the recorded bytes, and resumes the finished output rather than refusing it.
    case.upload_again(ORIGINAL)
    code, log = run_job(["run", "--config", str(config)], timeout=120)
    assert code == 0, log
    again = _input_entry(case.output_uri)
    assert again["version"] != first["version"] and again["digest"] == first["digest"], (first, again)
    assert again["records"] == first["records"] == 3

    assert len(EDITED) == len(ORIGINAL)
    case.write_input(EDITED)
    # A note an earlier attempt left (a stop on SIGTERM) must survive the refusal too.
    write_bytes_atomic(locate(case.output_uri.rstrip("/") + "/_interrupted.json"), b'{"signal": "SIGTERM"}')
    before = _snapshot(case.output_uri)
    code, log = run_job(["run", "--config", str(config)], timeout=120)
    assert code == EXIT_OUTPUT_MISMATCH, log
    assert f"rows.jsonl (content changed: {_sha256(ORIGINAL)} before, {_sha256(EDITED)} now)" in log, log
    # Refused before any work: the rows, the manifest and the earlier note are byte for byte what they were; the
    # one thing added is the refusal named in `_failed.json`, which every tier's nightly machine and the Batch API
    # read at once (issue 59, finding 1: without it the EKS tiers' KubeRay and the small tier's machine start the
    # job again and again). The next attempt's start removes it.
    after = _snapshot(case.output_uri)
    failure_uri = locate(case.output_uri.rstrip("/") + "/_failed.json").uri
    note = json.loads(after.pop(failure_uri))
    # On a local output the note's fenced write takes a lock file beside it (workload/files/storage.py).
    after.pop(failure_uri.replace("/_failed.json", "/._failed.json.lock"), None)
    assert after == before, sorted(set(after) ^ set(before))
    assert note["error_type"] == "OutputMismatchError", note
    assert (
        "holds output of a different input" in note["reason"]
        and "rows.jsonl (content changed: sha256:" in note["reason"]
    )
    if case.output_uri.startswith("s3://"):  # what the machines' ReadFailureReason step reads, without the body
        bucket, key = case.output_uri[5:].split("/", 1)
        metadata = boto3.client("s3").head_object(Bucket=bucket, Key=f"{key}/_failed.json")["Metadata"]
        assert "rows.jsonl (content changed" in metadata["reason"], metadata
