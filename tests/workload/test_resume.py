"""Kill the job at each dangerous moment (SIGKILL of its whole process group, as a Spot reclaim or an OOM kill
does), and SIGTERM it as Kubernetes does; every rerun must finish only what is missing, with each input id exactly
once across results and errors, and a summary that counts the whole run.

Real Ray, real vLLM on the tiny model, a real S3-speaking server. Two engine starts per chain: the later kills land
where no engine is needed any more.
"""

from __future__ import annotations

import io
import json
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest

from tests.workload.jobrun import finish, run_job, start_job, write_config, write_jsonl

pytestmark = pytest.mark.slow

ROWS = 40  # 5 shards of 8
KILLED = -signal.SIGKILL


def _input_rows() -> list[object]:
    rows: list[object] = [{"id": f"r-{i:03d}", "prompt": f"Resume test prompt {i}"} for i in range(ROWS - 2)]
    rows.insert(11, "{not json")
    rows.insert(30, {"id": "r-005", "prompt": "repeated id"})
    return rows


class Output:
    """Reads a job's output folder (local or S3) the way a consumer would."""

    def __init__(self, names: Callable[[str], list[str]], read: Callable[[str], bytes]) -> None:
        self.names, self.read = names, read

    def markers(self) -> list[dict]:
        return [json.loads(self.read(n)) for n in self.names("_commits/")]

    def assert_results_only_from_committed_shards(self) -> None:
        committed = {f for m in self.markers() for f in m["files"]}
        published = set(self.names("results/")) | set(self.names("errors/"))
        assert published <= committed, f"uncommitted files visible: {sorted(published - committed)}"

    def ids(self) -> list[str | None]:
        ids: list[str | None] = []
        for name in self.names("results/"):
            ids += pq.read_table(io.BytesIO(self.read(name))).column("id").to_pylist()
        for name in self.names("errors/"):
            ids += [json.loads(line)["id"] for line in self.read(name).decode().splitlines()]
        return ids

    def summary(self) -> dict | None:
        return json.loads(self.read("summary.json")) if "summary.json" in self.names("") else None


def _local_output(root: Path) -> Output:
    def names(prefix: str) -> list[str]:
        base = root / prefix if prefix else root
        if not base.exists():
            return []
        found = base.rglob("*") if prefix else base.glob("*")
        return sorted(str(p.relative_to(root)) for p in found if p.is_file() and not p.name.startswith("."))

    return Output(names, lambda name: (root / name).read_bytes())


def _s3_output(bucket: str, prefix: str) -> Output:
    s3 = boto3.client("s3")

    def names(sub: str) -> list[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{sub}")
        keys = [o["Key"][len(prefix) + 1 :] for page in pages for o in page.get("Contents", [])]
        return sorted(k for k in keys if sub or "/" not in k)

    return Output(names, lambda name: s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read())


def _assert_complete(output: Output, attempts: int) -> None:
    ids = output.ids()
    expected = [f"r-{i:03d}" for i in range(ROWS - 2)] + ["r-005", None]
    assert sorted(ids, key=str) == sorted(expected, key=str), "an id was lost or doubled"
    summary = output.summary()
    assert summary is not None
    assert (summary["rows_in"], summary["rows_ok"], summary["rows_failed"]) == (ROWS, ROWS - 2, 2)
    assert summary["attempts"] == attempts and summary["shards"] == 5
    assert summary["output_tokens"] == sum(m["output_tokens"] for m in output.markers())
    output.assert_results_only_from_committed_shards()


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def _run(config: Path, failpoint: str | None = None, *flags: str) -> tuple[int, str]:
    env = {"LLM_BATCH_FAILPOINT": failpoint} if failpoint else {}
    return run_job(["run", "--config", str(config), *flags], env)


def test_local_kills_at_every_commit_point_then_resume(tmp_path: Path, model_cache: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", _input_rows())
    out = tmp_path / "out"
    config = write_config(tmp_path / "job.yaml", str(source), str(out), model_cache)
    output = _local_output(out)

    code, log = _run(config, "attempt_started")  # before anything is committed
    assert code == KILLED, log
    assert output.markers() == [] and output.names("results/") == []

    code, log = _run(config, "shard_parts_written:2")  # while a shard's results are being written
    assert code == KILLED, log
    assert len(output.markers()) == 1
    assert output.names("_pending/"), "the killed shard's parts should be left in _pending/"
    output.assert_results_only_from_committed_shards()

    remaining = 5 - len(output.markers())
    code, log = _run(config, f"shard_committed:{remaining}")  # marker of the last shard written, files not moved
    assert code == KILLED, log
    assert len(output.markers()) == 5 and output.summary() is None
    output.assert_results_only_from_committed_shards()

    changed = write_config(tmp_path / "changed.yaml", str(source), str(out), model_cache, sampling={"max_tokens": 9})
    code, log = _run(changed)  # a config that would change results must not be mixed in
    assert code == 3 and "sampling.max_tokens" in log, log

    code, log = _run(config, "summary_writing")  # while the summary is written
    assert code == KILLED, log
    assert output.summary() is None

    code, log = _run(config)
    assert code == 0, log
    assert "5/5 shards already committed" in log  # nothing was redone
    _assert_complete(output, attempts=5)
    times = output.summary()["attempt_times"]
    assert [t["attempt"] for t in times] == [1, 2, 3, 4, 5]
    assert times[0]["killed"] and times[0]["wall_s"] is None  # killed before it noted any time
    assert times[1]["killed"] and times[2]["killed"] and not times[4]["killed"]
    assert all(t["wall_s"] > 0 for t in times[1:]), times


def test_s3_sigterm_then_kills_then_resume(tmp_path: Path, model_cache: Path, moto_endpoint: str) -> None:
    bucket = f"resume-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    # One object per shard: a read block holds one file's rows, and the engine answers a block whole, so with one
    # object every row would reach the driver at once and no shard could commit before the SIGTERM.
    lines = [(r if isinstance(r, str) else json.dumps(r)) + "\n" for r in _input_rows()]
    per_shard = len(lines) // 5
    for shard in range(5):
        s3.put_object(
            Bucket=bucket,
            Key=f"in/rows-{shard}.jsonl",
            Body="".join(lines[shard * per_shard : (shard + 1) * per_shard]),
        )
    grace = 20
    config = write_config(
        tmp_path / "job.yaml",
        f"s3://{bucket}/in/",
        f"s3://{bucket}/out",
        model_cache,
        resume={"grace_period_s": grace},
        # One batch in flight and long answers (every row decodes all its tokens): shards commit seconds apart, so
        # the SIGTERM lands mid-run. With 32 tokens that may stop, a quiet machine committed the other four shards
        # within the half second before the signal, and the run rightly finished (exit 0).
        max_concurrent_batches=1,
        sampling={"max_tokens": 96, "temperature": 0.0, "ignore_eos": True},
    )
    output = _s3_output(bucket, "out")

    job = start_job(["run", "--config", str(config)])
    deadline = time.monotonic() + 540
    while not output.markers() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    assert output.markers(), "no shard was committed before the deadline"
    job.send_signal(signal.SIGTERM)  # to the driver alone, as the kubelet does to PID 1
    signalled = time.monotonic()
    code, log = finish(job, timeout=grace + 30)
    assert code == 143, log
    assert time.monotonic() - signalled < grace + 10, "did not exit within the grace period"
    assert "SIGTERM" in log and output.summary() is None
    output.assert_results_only_from_committed_shards()
    # The nightly state machine reads why from the object's metadata, and retries on this note.
    note = s3.head_object(Bucket=bucket, Key="out/_interrupted.json")
    assert "SIGTERM" in note["Metadata"]["reason"]

    attempts = 3
    remaining = 5 - len(output.markers())
    if remaining:  # the SIGTERM can land after the last shard; then there is nothing left to kill mid-commit
        code, log = _run(config, f"shard_committed:{remaining}")
        assert code == KILLED, log
        output.assert_results_only_from_committed_shards()
        attempts += 1

    code, log = _run(config, "summary_writing")
    assert code == KILLED, log

    code, log = _run(config)
    assert code == 0, log
    _assert_complete(output, attempts=attempts)
    assert "_interrupted.json" not in output.names("")
