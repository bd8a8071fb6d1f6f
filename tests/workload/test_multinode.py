"""The job on a real multi-node Ray cluster (tests/workload/cluster_box.py): the RayJob manifest's head, two GPU
workers each with a disk of its own, the model on a moto S3 server, the job submitted with the manifest's
entrypoint. One cluster start serves both tests; the second kills a worker, so it runs last."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.eks_job import base_rayjob_args, night_manifests
from infra.k8s.rayjob import RayJobArgs
from infra.ops.stacks import offline_config
from tests.infra.k8s_fixtures import IMAGE
from tests.workload import cluster_box
from workload.config import build_config
from workload.model_source import COMPLETE_MARKER
from workload.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.slow

ROWS = 240
# Enough that the engines are still busy when the first shard commits and the worker is killed.
LOST_ROWS = 1200
SHARD_ROWS = 20
JOB_TIMEOUT_S = 300
# The engine and stage sizes that fit 2 shared cores; everything else is the medium tier's job config as rendered.
CPU_STAND_IN = {
    "engine.max_model_len": 512,
    "engine.max_num_seqs": 16,
    "engine.enforce_eager": True,
    "batch_size": 8,
    "max_concurrent_batches": 2,
    "stages.batch_size": 8,
    "sampling.max_tokens": 48,
    "sampling.ignore_eos": True,
    "output.shard_rows": SHARD_ROWS,
    # No CloudWatch here; the metrics path is tested elsewhere.
    "metrics.sink": "none",
    "metrics.log_group": None,
}


@pytest.fixture(scope="module")
def bucket(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Input rows and the tiny model (as an s3:// model folder) on the moto server."""
    name = f"multinode-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=name)
    model = ensure_tiny_model(tmp_path_factory.mktemp("model"))
    for file in sorted(p for p in model.iterdir() if p.is_file()):
        s3.put_object(Bucket=name, Key=f"models/tiny/{file.name}", Body=file.read_bytes())
    for folder, count in (("in", ROWS), ("in-lost", LOST_ROWS)):
        rows = "".join(json.dumps({"id": f"r{i:04d}", "prompt": f"Summarise ticket {i}."}) + "\n" for i in range(count))
        s3.put_object(Bucket=name, Key=f"{folder}/rows.jsonl", Body=rows.encode())
    return name


def _args(bucket: str) -> RayJobArgs:
    base = base_rayjob_args(offline_config("medium"), "medium", IMAGE, bucket)
    overrides: dict[str, Any] = {**CPU_STAND_IN, "model.source": f"s3://{bucket}/models/tiny"}
    job = build_config(base.job.model_dump(mode="json"), overrides)
    return RayJobArgs.model_validate({**base.model_dump(), "job": job})


@pytest.fixture(scope="module")
def cluster(bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster_box.Cluster]:
    reason = cluster_box.can_run()
    if reason:
        pytest.skip(reason)
    # The manifests only fix the cluster's shape here; each test renders its own night (input, output).
    rayjob, config_map = cluster_box.load_manifests(
        night_manifests(_args(bucket), run_id="box", input_uri=f"s3://{bucket}/in/", output_uri=f"s3://{bucket}/o/")
    )
    box = cluster_box.Cluster(rayjob, config_map, tmp_path_factory.mktemp("cluster"))
    try:
        box.start()
        yield box
    finally:
        box.stop()


def _night(cluster: cluster_box.Cluster, bucket: str, run: str, folder: str = "in") -> str:
    """Render this run's ConfigMap and put it where every node's pod mounts it; returns the output URI."""
    output = f"s3://{bucket}/out/{run}/"
    rayjob, config_map = cluster_box.load_manifests(
        night_manifests(_args(bucket), run_id=run, input_uri=f"s3://{bucket}/{folder}/", output_uri=output)
    )
    spec = rayjob["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["rayStartParams"] == cluster.spec["headGroupSpec"]["rayStartParams"]
    assert rayjob["spec"]["entrypoint"] == cluster.rayjob["spec"]["entrypoint"]
    cluster.rayjob, cluster.config_map = rayjob, config_map
    for node in [cluster.head, *cluster.workers]:
        assert node is not None
        for name, text in config_map["data"].items():
            (node.root / "config" / name).write_text(text)
    return output


def _results(bucket: str, output: str) -> list[dict[str, Any]]:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from workload.storage import _s3_filesystem

    prefix = output[len("s3://") :] + "results"
    fs: pafs.FileSystem = _s3_filesystem()
    files = fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
    rows: list[dict[str, Any]] = []
    for info in files:
        if info.path.endswith(".parquet"):
            rows += pq.read_table(info.path, filesystem=fs).to_pylist()
    return rows


def _summary(output: str) -> dict[str, Any]:
    bucket, prefix = output[len("s3://") :].split("/", 1)
    return dict(json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=f"{prefix}summary.json")["Body"].read()))


def _weights(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in {".safetensors", ".bin", ".pt"}]


def test_each_worker_fetches_the_model_into_its_own_cache(cluster: cluster_box.Cluster, bucket: str) -> None:
    output = _night(cluster, bucket, "first")
    started = time.monotonic()
    status, logs = cluster.wait(cluster.submit(), JOB_TIMEOUT_S)
    assert status == "SUCCEEDED", logs[-6000:]
    print(f"job wall time {time.monotonic() - started:.1f} s")
    ids = Counter(row["id"] for row in _results(bucket, output))
    assert len(ids) == ROWS and set(ids.values()) == {1}
    # One engine on each worker (each has one GPU), none on the head.
    engines = [a for a in cluster.actors("GuardedEngineUDF") if a["state"] == "DEAD"] or cluster.actors(
        "GuardedEngineUDF"
    )
    head_node = {n["node_id"] for n in cluster.alive_nodes() if n.get("is_head_node")}
    engine_nodes = {a["node_id"] for a in engines}
    assert len(engine_nodes) == len(cluster.workers) and not engine_nodes & head_node, engines
    for worker in cluster.workers:
        copies = list(worker.models.rglob(COMPLETE_MARKER))
        assert len(copies) == 1, worker.name
        assert _weights(copies[0].parent), f"{worker.name} has no weights in its own cache"
    assert cluster.head is not None
    assert not _weights(cluster.head.models), "the head fetched weights"


def _first_commit(output: str, timeout_s: float) -> None:
    bucket, prefix = output[len("s3://") :].split("/", 1)
    s3 = boto3.client("s3")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}_commits/").get("KeyCount", 0):
            return
        time.sleep(0.5)
    raise TimeoutError("no shard committed")


@pytest.mark.xfail(
    strict=True,
    reason="issue 16, open: with engine batches in flight on the killed worker the run fails with "
    "ActorUnavailableError. pipeline.guard_engine_stage bounds max_task_retries to engine.max_actor_restarts (3); "
    "Ray spends those retries in seconds on the dead actor's refused connection, before it marks the node dead "
    "and restarts the actor, so Ray Data fails the dataset. Seen 2026-11-30 (docs/model-and-nodes.md).",
)
def test_a_lost_worker_costs_only_its_work_in_flight(cluster: cluster_box.Cluster, bucket: str) -> None:
    """Runs last: it kills a worker node (SIGKILL to its raylet and every process on it, as a Spot reclaim does)
    once the first shard is committed; the run finishes on the other worker."""
    output = _night(cluster, bucket, "lost", "in-lost")
    started = time.monotonic()
    job = cluster.submit()
    _first_commit(output, JOB_TIMEOUT_S)
    lost = cluster.workers[-1]
    lost.kill()
    print(f"killed {lost.name} {time.monotonic() - started:.1f} s after submission")
    status, logs = cluster.wait(job, JOB_TIMEOUT_S)
    print(logs[-4000:])
    assert status == "SUCCEEDED", logs[-6000:]
    print(f"job wall time {time.monotonic() - started:.1f} s")
    ids = Counter(row["id"] for row in _results(bucket, output))
    assert len(ids) == LOST_ROWS and set(ids.values()) == {1}
    # What the loss cost: the engine batches Ray reran (the lost node's in flight), and rows that reached the
    # driver twice (dropped there, counted in the attempt's record).
    dead = {n["node_id"] for n in cluster.all_nodes() if n["state"] == "DEAD"}
    assert len(dead) == 1
    engine_tasks = cluster.tasks("GuardedEngineUDF")
    rerun = [t for t in engine_tasks if t["attempt_number"] > 0]
    assert not {t["node_id"] for t in rerun} & dead  # reruns ran on the surviving worker
    lost_in_flight = [t for t in engine_tasks if t["node_id"] in dead and t["state"] != "FINISHED"]
    bucket_name, prefix = output[len("s3://") :].split("/", 1)
    manifest = json.loads(
        boto3.client("s3").get_object(Bucket=bucket_name, Key=f"{prefix}_manifest.json")["Body"].read()
    )
    (attempt,) = manifest["attempts"]
    block_rows = 4 * int(cluster_box.yaml.safe_load(cluster.config_map["data"]["job.yaml"])["batch_size"])
    print(
        f"lost node: {len(lost_in_flight)} engine batches in flight, {len(rerun)} rerun on the other worker "
        f"(at most {len(rerun) * block_rows} rows re-done); {attempt['rows_redelivered']} rows reached the driver "
        "twice and were dropped"
    )
    assert rerun, "no engine batch was in flight on the lost worker: it was killed too late to test anything"
    assert len(rerun) * block_rows < LOST_ROWS / 2
