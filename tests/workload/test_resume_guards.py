"""A rerun against input edited in place (same size, other rows) is refused naming the file, through the CLI as the
image runs it, on local files and on a real S3-speaking server. (A live lease refusing `run` and `--restart` is
shown with the real job in test_lease_e2e.py.)

No engine starts here: the input holds only rows that fail validation, whose shards commit without one.
"""

from __future__ import annotations

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


@pytest.fixture(params=["local", "s3"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    if request.param == "local":
        source = tmp_path / "in" / "rows.jsonl"
        source.parent.mkdir()
        yield Case(str(source.parent), str(tmp_path / "out"), source.write_bytes)
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"guards-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)

    def write(body: bytes) -> None:
        s3.put_object(Bucket=bucket, Key="in/rows.jsonl", Body=body)

    yield Case(f"s3://{bucket}/in/", f"s3://{bucket}/out", write)


# Rows without a prompt: each is recorded as an error, and a shard of only such rows commits without an engine.
ORIGINAL = b'{"id": "a-1"}\n{"id": "a-2"}\n{"id": "a-3"}\n'
EDITED = b'{"id": "b-1"}\n{"id": "b-2"}\n{"id": "b-3"}\n'  # same size, other rows


def _snapshot(uri: str) -> dict[str, bytes]:
    root = locate(uri)
    return {f.uri: read_bytes(f) for f in list_files(root)}


def test_input_edited_in_place_same_size_is_refused_naming_the_file(case: Case, tmp_path: Path) -> None:
    case.write_input(ORIGINAL)
    config = write_config(tmp_path / "job.yaml", case.input_uri, case.output_uri, tmp_path / "models")
    code, log = run_job(["run", "--config", str(config)], timeout=120)
    assert code == 0, log
    # (A rerun against unchanged input is accepted: test_lease_e2e.py's waiting attempt resumes so.)

    assert len(EDITED) == len(ORIGINAL)
    case.write_input(EDITED)
    # A note an earlier attempt left (a stop on SIGTERM) must survive the refusal too.
    write_bytes_atomic(locate(case.output_uri.rstrip("/") + "/_interrupted.json"), b'{"signal": "SIGTERM"}')
    before = _snapshot(case.output_uri)
    code, log = run_job(["run", "--config", str(config)], timeout=120)
    assert code == EXIT_OUTPUT_MISMATCH, log
    assert "rows.jsonl (content changed)" in log, log
    # Refused before any work: the output is byte for byte what it was, with no failure note that would make
    # the nightly state machine end a resumable night (only a person's --restart or a new output may change it).
    assert _snapshot(case.output_uri) == before
