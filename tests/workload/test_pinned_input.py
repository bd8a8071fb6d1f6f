"""Input reads pinned to the plan, on local files and on a real S3-speaking server (moto over HTTP, which honours
If-Match on GET): rows appended after the plan counted a file stop the attempt naming the file, before any of the
changed bytes can be committed; a file uploaded after the plan is named in the summary. No Ray: the readers' own
code (RecordReader's open and read, what each of RecordSource's read tasks runs) runs in this process."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.contract.cli_errors import describe
from workload.contract.config import InputConfig, JobConfig
from workload.files.pinned import InputChangedError, open_pinned
from workload.files.storage import Location
from workload.job.committer import ShardCommitter
from workload.job.input_plan import InputPlan, files_after_plan, plan_input, verify_unchanged
from workload.job.output import OutputStore
from workload.telemetry.metrics import NullMetrics

ROWS = [{"id": f"r-{i}", "prompt": f"p{i}"} for i in range(10)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@dataclass
class Input:
    folder: str  # the input URI
    put: Callable[[str, bytes], object]

    def uri(self, name: str) -> str:
        return f"{self.folder}/{name}"


@pytest.fixture(params=["local", "s3"])
def given(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Input]:
    if request.param == "local":
        folder = tmp_path / "in"
        folder.mkdir()
        yield Input(str(folder), lambda name, data: (folder / name).write_bytes(data))
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"pinned-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    yield Input(f"s3://{bucket}/in", lambda name, data: s3.put_object(Bucket=bucket, Key=f"in/{name}", Body=data))


def _append(given: Input, name: str, data: bytes) -> None:
    location = Location(given.uri(name))
    if location.is_s3:  # an S3 object is replaced whole: a new version with the rows added
        body = boto3.client("s3").get_object(Bucket=location.bucket, Key=location.key)["Body"].read()
        given.put(name, body + data)
    else:
        with open(location.path, "ab") as handle:
            handle.write(data)


def _read_file(plan: InputPlan, index: int) -> list[int]:
    """What a read task of the main stream yields for one planned file: the positions of its rows."""
    from workload.job.input_stream import RecordReader

    file = plan.files[index]
    source = RecordReader(plan.files, shard_rows=4, shards=None)
    with source._open_input_source(None, file.path) as stream:
        return [p for block in source._read_stream(stream, file.path) for p in block.column("_pos").to_pylist()]


def test_rows_appended_after_the_plan_stop_the_read_naming_the_file(given: Input) -> None:
    given.put("a.jsonl", _jsonl(ROWS))
    given.put("b.jsonl", _jsonl(ROWS))
    plan = plan_input(InputConfig(uri=given.folder)).with_counts([10, 10])  # as the id pass counted them
    assert plan.rows_in == 20 and _read_file(plan, 0) == list(range(10))

    _append(given, "a.jsonl", _jsonl([{"id": f"late-{i}", "prompt": "x"} for i in range(10)]))
    # Unpinned, the 10 new rows would take positions 10-19, the next file's, and those rows would be dropped.
    with pytest.raises(InputChangedError, match=given.uri("a.jsonl")) as stopped:
        _read_file(plan, 0)
    assert describe(stopped.value).exit_code == 3
    assert _read_file(plan, 1) == list(range(10, 20))  # the unchanged file reads as planned


def test_rows_appended_between_the_listing_and_the_id_pass_stop_its_read(given: Input) -> None:
    """The counts come out of the id pass's read: that read is pinned to the listed version too, so a count is
    never of other bytes than the plan listed."""
    given.put("a.jsonl", _jsonl(ROWS))
    listed = plan_input(InputConfig(uri=given.folder))
    assert listed.rows_in is None and _read_file(listed, 0) == list(range(10))  # uncounted: positions from 0
    _append(given, "a.jsonl", _jsonl([{"id": "late", "prompt": "x"}]))
    with pytest.raises(InputChangedError, match=given.uri("a.jsonl")):
        _read_file(listed, 0)


def test_a_shard_is_not_committed_once_its_local_file_changed_after_its_read(tmp_path: Path) -> None:
    """Local files: the reader checked size and mtime at open and at its end; the driver checks them again before
    each commit, after all the shard's rows were read, so no change between the read and the commit goes unseen."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(_jsonl(ROWS[:4]))
    config = JobConfig.model_validate(
        {"input": {"uri": str(path)}, "output": {"uri": str(tmp_path / "out"), "shard_rows": 4}}
    )
    plan = plan_input(config.input).with_counts([4])
    store = OutputStore(config.output.uri)
    committer = ShardCommitter(store, config, plan.rows_in, {0}, {}, 1, NullMetrics(), lambda: None)
    committer.verify_input = lambda shard: verify_unchanged(plan.files_with({shard}, 4))
    with open(path, "ab") as handle:  # appended after the rows were read, before their shard commits
        handle.write(_jsonl([{"id": "late", "prompt": "x"}]))
    rows = [
        {
            "_pos": i,
            "id": r["id"],
            "generated_text": "t",
            "num_input_tokens": 1,
            "num_generated_tokens": 1,
            "_max_tokens": 8,
            "_file": str(path),
            "_row": i,
            "_line": i + 1,
            "_raw": "",
            "_raw_encoding": "utf-8",
            "__inference_error__": "",
            "_passthrough": None,
            "batch_uuid": "b",
        }
        for i, r in enumerate(ROWS[:4])
    ]
    with pytest.raises(InputChangedError, match=str(path)):
        committer.take(pa.Table.from_pylist(rows))
    assert store.committed() == {} and committer.commits == []


def test_a_parquet_read_is_pinned_too(given: Input, tmp_path: Path) -> None:
    local = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), local)
    given.put("rows.parquet", local.read_bytes())
    plan = plan_input(InputConfig(uri=given.folder))
    assert plan.rows_in == 10 and _read_file(plan, 0) == list(range(10))
    pq.write_table(pa.Table.from_pylist(ROWS[:5]), local)
    given.put("rows.parquet", local.read_bytes())
    file = plan.files[0]
    with (
        pytest.raises(InputChangedError, match=given.uri("rows.parquet")),
        open_pinned(Location(file.uri), file.size, file.version, random_access=True) as handle,
    ):
        pq.ParquetFile(handle).read()


def test_a_file_uploaded_after_the_plan_is_named(given: Input) -> None:
    given.put("a.jsonl", _jsonl(ROWS))
    config = InputConfig(uri=given.folder)
    plan = plan_input(config)
    assert files_after_plan(config, plan) == []
    given.put("b.jsonl", _jsonl(ROWS))
    given.put("_READY", b"")  # a marker, not input
    assert files_after_plan(config, plan) == [given.uri("b.jsonl")]


def test_a_changed_file_found_under_rays_wrapping_is_the_jobs_own_verdict() -> None:
    """A read task's InputChangedError reaches the driver wrapped by Ray (here its text, as Ray Data re-raises it):
    the engine loop finds it and raises it as itself, so the CLI exits 3 naming the file."""
    from workload.job.engine_loop import _found_in

    wrapped = RuntimeError(
        "ray.exceptions.RayTaskError(InputChangedError): ray::ReadRecordSource() ...\n"
        "workload.files.pinned.InputChangedError: s3://b/in/a.jsonl changed during the attempt (removed); nothing"
    )
    found = _found_in(wrapped, InputChangedError)
    assert found is not None and found.startswith("s3://b/in/a.jsonl changed during the attempt")
    assert describe(InputChangedError(found)).exit_code == 3
    assert _found_in(RuntimeError("something else"), InputChangedError) is None
