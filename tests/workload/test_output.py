"""The shard commit protocol on a local disk and on a real S3-speaking server (moto, over HTTP)."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workload.contract.config import JobConfig
from workload.files.storage import delete_file, exists, list_files, locate, read_bytes, write_bytes_atomic
from workload.job.input_plan import InputPlan, plan_input
from workload.job.output import OutputFencedError, OutputStore

STATS = {"rows_ok": 2, "rows_failed": 1, "input_tokens": 10, "output_tokens": 20, "error_types": {"x": 1}}


@pytest.fixture(params=["local", "s3"])
def output_uri(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "out")
        return
    request.getfixturevalue("moto_endpoint")
    bucket = f"out-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/night/2026-11-29"


def _table(ids: list[str]) -> pa.Table:
    return pa.table({"id": ids, "generated_text": [f"answer {i}" for i in ids]})


def _names(store: OutputStore, folder: str) -> list[str]:
    return [f.path.rsplit("/", 1)[-1] for f in list_files(store.root.child(folder))]


def test_commit_publishes_parts_and_marker(output_uri: str) -> None:
    store = OutputStore(output_uri)
    commit = store.commit_shard(3, _table(["a", "b"]), [{"id": "c", "error_type": "x"}], STATS, attempt=1)
    assert commit.files == ["results/part-000003.g0a1.parquet", "errors/part-000003.g0a1.jsonl"]
    assert _names(store, "results") == ["part-000003.g0a1.parquet"]
    assert _names(store, "_commits") == ["shard-000003.g0a1.json"]
    assert _names(store, "_pending") == []
    table = pq.read_table(store.root.child("results", "part-000003.g0a1.parquet").path, filesystem=store.root.fs)
    assert table.column("id").to_pylist() == ["a", "b"]
    errors = read_bytes(store.root.child("errors", "part-000003.g0a1.jsonl")).decode().splitlines()
    assert [json.loads(line)["id"] for line in errors] == ["c"]
    assert set(store.committed()) == {3}


def test_recover_deletes_uncommitted_parts_and_rolls_committed_ones_forward(output_uri: str) -> None:
    store = OutputStore(output_uri)
    committed = store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    # A killed attempt: shard 1 reached _pending/ but no marker; shard 0's file was never moved to results/.
    write_bytes_atomic(store.root.child("_pending", "results", "part-000001.g0a1.parquet"), b"half a shard")
    write_bytes_atomic(store.root.child("results", "part-000002.g0a1.parquet"), b"stray, no marker")
    published = store.root.child("results", "part-000000.g0a1.parquet")
    body = read_bytes(published)
    delete_file(published)
    write_bytes_atomic(store.root.child("_pending", "results", "part-000000.g0a1.parquet"), body)

    commits = store.recover()

    assert set(commits) == {0} and commits[0] == committed
    assert _names(store, "results") == ["part-000000.g0a1.parquet"]
    assert read_bytes(published) == body
    assert list_files(store.root.child("_pending")) == []


def test_reset_removes_only_what_the_job_writes(output_uri: str) -> None:
    store = OutputStore(output_uri)
    store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    store.write_manifest({"attempts": []})
    store.write_summary({"rows_in": 1})
    neighbour = locate(output_uri + "/README.txt")
    write_bytes_atomic(neighbour, b"not ours")
    store.reset({"attempts": []})
    assert store.committed() == {}
    assert store.read_manifest() == {"attempts": [], "generation": 1} and store.read_summary() is None
    for folder in ("results", "errors", "_commits", "_pending"):
        assert _names(store, folder) == []
    assert read_bytes(neighbour) == b"not ours"


def test_a_marker_whose_files_are_gone_is_reported_not_trusted_and_its_shard_redone(output_uri: str, capsys) -> None:
    store = OutputStore(output_uri)
    store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    store.commit_shard(1, _table(["b"]), [{"id": "c", "error_type": "x"}], STATS, attempt=1)
    # Shard 1's result file vanished (deleted by hand, or by an attempt that ran without a lease): its marker
    # names a file that is neither published nor pending.
    delete_file(store.root.child("results", "part-000001.g0a1.parquet"))

    commits = store.recover()

    assert set(commits) == {0}
    assert store.untrusted == {1: ["results/part-000001.g0a1.parquet"]}
    assert "shard 1" in capsys.readouterr().err
    # Nothing of a shard with a marker is deleted: shard 1's surviving errors file and its marker stay.
    assert _names(store, "errors") == ["part-000001.g0a1.jsonl"]
    assert set(store.committed()) == {0, 1}

    # The redo commits shard 1 again without errors: the old commit's errors file and marker must not survive.
    store.commit_shard(1, _table(["b", "c"]), [], STATS, attempt=2)
    assert _names(store, "results") == ["part-000000.g0a1.parquet", "part-000001.g0a2.parquet"]
    assert _names(store, "errors") == []
    assert _names(store, "_commits") == ["shard-000000.g0a1.json", "shard-000001.g0a2.json"]
    assert store.committed()[1].attempt == 2 and store.untrusted == {}


def test_an_output_of_a_thousand_committed_shards_reopens_in_seconds_on_s3(moto_endpoint: str) -> None:
    """Resume lists the markers once and reads them in parallel, rather than one request after another."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    bucket = f"big-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    shards = 1000

    def put(shard: int) -> None:
        part = f"results/part-{shard:06d}.parquet"
        marker = {**STATS, "shard": shard, "attempt": 1, "committed_at": "t", "files": [part]}
        marker["error_types"] = {}
        s3.put_object(Bucket=bucket, Key=f"out/{part}", Body=b"rows")
        s3.put_object(Bucket=bucket, Key=f"out/_commits/shard-{shard:06d}.json", Body=json.dumps(marker).encode())

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(put, range(shards)))
    started = time.monotonic()
    committed = OutputStore(f"s3://{bucket}/out").recover()
    elapsed = time.monotonic() - started
    assert sorted(committed) == list(range(shards))
    assert sum(c.rows_ok for c in committed.values()) == shards * STATS["rows_ok"]
    assert elapsed < 20, f"reopening {shards} shards took {elapsed:.1f} s"


def test_a_torn_marker_is_never_read_as_one_and_is_swept(output_uri: str) -> None:
    """A failed atomic write (ENOSPC on the fsync) left `_commits/.shard-N.json.<random>.tmp` with half a marker.
    Locally that is what write_bytes_atomic's temporary is; on S3 the same name, left by a tool that writes so."""
    store = OutputStore(output_uri)
    store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)
    torn = store.root.child("_commits", ".shard-000001.json.5f2c9e0a.tmp")
    write_bytes_atomic(torn, b'{"shard": 1, "rows_ok": ')
    assert set(store.committed()) == {0}
    assert set(store.recover()) == {0}
    assert _names(store, "_commits") == ["shard-000000.g0a1.json"]  # swept


def test_a_failed_fsync_leaves_no_temporary_behind(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local only: the fsync is the local write's (an S3 PUT is whole or absent)."""
    import errno
    import os

    from workload.files.storage import StorageError

    store = OutputStore(str(tmp_path / "out"))
    store.commit_shard(0, _table(["a"]), [], STATS, attempt=1)

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(StorageError, match="No space left"):
        store.commit_shard(1, _table(["b"]), [], STATS, attempt=1)
    monkeypatch.undo()
    leftovers = [f.path for f in list_files(store.root) if f.path.rsplit("/", 1)[-1].startswith(".")]
    assert leftovers == []
    assert set(OutputStore(str(tmp_path / "out")).recover()) == {0}


def _legacy_output(output_uri: str, input_uri: str) -> tuple[JobConfig, InputPlan]:
    """An output exactly as the job wrote it before generations and tags (commit d8e64ca): untagged part and
    marker names, markers without `generation`, a manifest without `generation`. Shard 0 of 2 committed."""
    from workload.job.attempt import _fingerprint

    config = JobConfig.model_validate({"input": {"uri": input_uri}, "output": {"uri": output_uri, "shard_rows": 2}})
    plan = plan_input(config.input)
    root = locate(output_uri)
    manifest = {
        "config_hash": config.output_hash(),
        "output_affecting": config.output_affecting(),
        "input_fingerprint": _fingerprint(plan.listing()),
        "input_files": plan.listing(),
        "rows_in": plan.rows_in,
        "attempts": [{"attempt": 1, "started_at": "2026-11-29T01:00:00.000+00:00", "ended_at": None, "wall_s": 3.0}],
    }
    write_bytes_atomic(root.child("_manifest.json"), json.dumps(manifest, indent=2, sort_keys=True).encode())
    buffer = io.BytesIO()
    pq.write_table(_table(["r0", "r1"]), buffer)
    write_bytes_atomic(root.child("results", "part-000000.parquet"), buffer.getvalue())
    marker = {**STATS, "shard": 0, "attempt": 1, "committed_at": "t", "files": ["results/part-000000.parquet"]}
    write_bytes_atomic(root.child("_commits", "shard-000000.json"), json.dumps(marker).encode())
    write_bytes_atomic(root.child("_interrupted.json"), b'{"reason": "stopped by SIGTERM"}')
    return config, plan


def test_an_output_made_before_generations_resumes(output_uri: str, tmp_path) -> None:
    from workload.job.attempt import _start_attempt

    input_path = tmp_path / "in.jsonl"
    input_path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": "p"}) + "\n" for i in range(4)))
    config, plan = _legacy_output(output_uri, str(input_path))

    store = OutputStore(output_uri)
    manifest, attempt = _start_attempt(store, config, plan, store.read_manifest())
    assert attempt == 2 and store.generation == 0 and "generation" not in manifest
    commits = store.recover()
    assert set(commits) == {0} and commits[0].files == ["results/part-000000.parquet"]
    store.commit_shard(1, _table(["r2", "r3"]), [], STATS, attempt=attempt)
    assert _names(store, "results") == ["part-000000.parquet", "part-000001.g0a2.parquet"]
    assert set(OutputStore(output_uri).recover()) == {0, 1}
    assert store.read_interrupted() is None  # the old note was cleared by the new attempt


def test_the_successor_replaces_a_stale_attempts_summary_and_files(output_uri: str) -> None:
    """A stale attempt (it read the output before its successor started, and woke after) writes summary.json,
    output.jsonl and a failure note into the gap; the successor, which owns the manifest, replaces them, and the
    stale one is fenced at its next manifest write."""
    stale = OutputStore(output_uri)
    stale.read_manifest()
    stale.write_manifest({"attempts": [1]})
    successor = OutputStore(output_uri)
    successor.read_manifest()
    successor.write_manifest({"attempts": [1, 2]})
    stale.write_summary({"rows_ok": 1})  # absent when it looked: its create goes through
    stale.write_file("output.jsonl", b"stale\n")
    stale.write_failure("Stale", "from the stale attempt")
    successor.write_file("output.jsonl", b"fresh\n")
    successor.write_summary({"rows_ok": 2})
    successor.clear_notes()
    root = locate(output_uri)
    assert read_bytes(root.child("output.jsonl")) == b"fresh\n"
    assert json.loads(read_bytes(root.child("summary.json")))["rows_ok"] == 2
    assert not exists(root.child("_failed.json"))
    successor.write_interrupted("SIGTERM", 1)
    with pytest.raises(OutputFencedError):
        stale.write_summary({"rows_ok": 3})  # the successor's is there now, and the manifest is not the stale one's
    assert exists(root.child("_interrupted.json"))  # the stale attempt took none of its successor's notes away
    third = OutputStore(output_uri)  # and once a later attempt starts, the successor is the stale one
    third.read_manifest()
    third.write_manifest({"attempts": [1, 2, 3]})
    third.write_summary({"rows_ok": 4})
    with pytest.raises(OutputFencedError):
        successor.write_summary({"rows_ok": 5})
    assert json.loads(read_bytes(root.child("summary.json")))["rows_ok"] == 4
