"""The job on a real multi-node Ray cluster (tests/workload/cluster_box.py): the RayJob manifest's head, two GPU
workers each with a disk of its own, the model on a moto S3 server, the job submitted with the manifest's
entrypoint.

One night serves both tests: a worker is killed mid-run (SIGKILL to its raylet and every process on it, as a Spot
reclaim does) while its engine holds a batch, and a new worker pod starts in its place, as KubeRay does for a
fixed-size worker group. Each run pays about two and a half minutes of start-up on 2 cores (the id pass, then the
stage actors and engines), so a second, undisturbed run would nearly double the module's time; what the first test
checks (the run completes, each worker fetched the model once into its own cache however many of its actors load
it, the head fetched nothing) holds on this run too, for every worker that loaded the model.

Where Ray puts the lost worker's work is Ray's choice: its engine restarts on the new worker once that joins (a
minute of pod and engine start on 2 cores), and the batches in flight rerun on whichever live engine is free first.
On a quiet machine the surviving worker may finish the night before the new engine is up (CI, 2026-12-07: killed
at 144.5 s, done 60.5 s later, the new worker never loaded the model), so the tests hold the run to live workers,
not to the new one."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.eks_job import base_rayjob_args, night_manifests
from infra.k8s.rayjob import RayJobArgs
from infra.ops.stacks import offline_config
from tests.infra.k8s_fixtures import IMAGE
from tests.workload import cluster_box
from workload.contract.config import build_config
from workload.contract.entrypoint import MODEL_CACHE_DIR, MODELS_DIR
from workload.engine.model_source import COMPLETE_MARKER, FETCH_LOG
from workload.engine.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.slow

# Several files: each is one block, so one engine batch (Ray Data's task) and, at SHARD_ROWS rows, one shard: the
# engine batch is a file's rows, since the job cuts the engine input into blocks of one batch (pipeline.py). The
# work spreads over both engines, and shards commit while other batches are still in flight.
FILES = 24
FILE_ROWS = 20
ROWS = FILES * FILE_ROWS
SHARD_ROWS = FILE_ROWS
JOB_TIMEOUT_S = 420
# The actor classes that load the model on their node (workload/engine/node_stages.py, guard.py, pipeline.py).
MODEL_LOADERS = ("GuardedEngineUDF", "NodeTokenizeUDF", "NodeDetokenizeUDF", "ApplyChatTemplate")
# The engine and stage sizes that fit 2 shared cores; everything else is the medium tier's job config as rendered.
CPU_STAND_IN = {
    "engine.max_model_len": 512,
    "engine.max_num_seqs": 16,
    "engine.enforce_eager": True,
    "batch_size": FILE_ROWS,
    "max_concurrent_batches": 2,
    "stages.batch_size": 8,
    "sampling.max_tokens": 160,  # engine work for most of a minute, so batches are in flight at the first commit
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
    for part in range(FILES):
        first = part * FILE_ROWS
        rows = "".join(
            json.dumps({"id": f"r{i:04d}", "prompt": f"Summarise ticket {i}."}) + "\n"
            for i in range(first, first + FILE_ROWS)
        )
        s3.put_object(Bucket=name, Key=f"in/rows-{part:02d}.jsonl", Body=rows.encode())
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

    from workload.files.storage import _s3_filesystem

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


def _engine_batches(cluster: cluster_box.Cluster) -> list[dict[str, Any]]:
    """Every attempt of every engine batch (Ray Data's actor task `submit`; a rerun has attempt_number above 0)."""
    return [t for t in cluster.tasks("GuardedEngineUDF") if t["name"].endswith(".submit")]


def _name(cluster: cluster_box.Cluster, ray_node_id: str | None) -> str | None:
    node = cluster.node_named(ray_node_id) if ray_node_id else None
    return node.name if node is not None else None


def _busy_worker(cluster: cluster_box.Cluster, timeout_s: float) -> tuple[cluster_box.Node, str]:
    """A worker whose engine has a batch in hand right now, and its Ray node id."""
    deadline = time.monotonic() + timeout_s
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = _engine_batches(cluster)
        for task in seen:
            if task["state"] != "RUNNING" or not task.get("node_id"):
                continue
            node = cluster.node_named(task["node_id"])
            if node is not None and node in cluster.workers:
                return node, str(task["node_id"])
        time.sleep(0.5)
    states = Counter((t["state"], _name(cluster, t["node_id"])) for t in seen)
    pytest.fail(f"no engine batch seen running on a worker: {states}")


def _survivors(cluster: cluster_box.Cluster, night: Night) -> list[cluster_box.Node]:
    """The workers that ran the night from its start and were not killed."""
    return [w for w in cluster.workers if w not in (night.lost, night.replacement)]


@dataclass
class Night:
    output: str
    status: str
    logs: str
    lost: cluster_box.Node
    lost_id: str  # its Ray node id
    replacement: cluster_box.Node


@pytest.fixture(scope="module")
def night(cluster: cluster_box.Cluster, bucket: str) -> Night:
    output = _night(cluster, bucket, "night")
    started = time.monotonic()
    job = cluster.submit()
    # Not the first commit: the driver gets rows in bursts (most of them once Ray Data has finished, seen
    # 2026-12-01), so a commit comes too late to find work in flight. Not the first answered batch either: the
    # state API showed the first FINISHED engine batch only once all 24 were (CI, 2026-12-07 21:24, a 97 s night
    # on a quiet machine). A batch RUNNING on a worker is one its engine holds now: Ray Data hands batches only to
    # actors whose constructor (the engine's start) has returned.
    lost, lost_id = _busy_worker(cluster, JOB_TIMEOUT_S)
    lost.kill()
    killed_at = time.monotonic()
    replacement = cluster.add_worker()
    status, logs = cluster.wait(job, JOB_TIMEOUT_S)
    print(
        f"killed {lost.name} {killed_at - started:.1f} s after submission; job wall time "
        f"{time.monotonic() - started:.1f} s ({time.monotonic() - killed_at:.1f} s after the kill)"
    )
    return Night(output, status, logs, lost, lost_id, replacement)


def test_each_worker_fetches_the_model_into_its_own_cache(cluster: cluster_box.Cluster, night: Night) -> None:
    """The job completes; each worker that ran an engine fetched the model into its own cache; the head none."""
    assert night.status == "SUCCEEDED", night.logs[-6000:]
    bucket = night.output[len("s3://") :].split("/", 1)[0]
    ids = Counter(row["id"] for row in _results(bucket, night.output))
    assert len(ids) == ROWS and set(ids.values()) == {1}
    # Two engines (each worker has one GPU), none on the head; the lost worker's engine is the same actor, restarted
    # on the new worker or still waiting for its GPU when the night ended.
    engines = cluster.actors("GuardedEngineUDF")
    engine_nodes = {_name(cluster, a["node_id"]) for a in engines}
    assert len(engines) == 2 and "head" not in engine_nodes, engines
    # One fetch per node, however many of its actors load the model (the engine, the tokenizer, detokenizer and
    # chat-template stages each resolve it): the node lock makes the first fetch and the others find its copy.
    loaders = [a for a in cluster.actors("") if any(name in (a["class_name"] or "") for name in MODEL_LOADERS)]
    per_node = Counter(_name(cluster, a["node_id"]) for a in loaders)
    # Both first workers loaded the model before the kill (the lost one was answering a batch); the new one did only
    # if its engine came up before the night ended. A worker's own disk says whether it fetched.
    loading = [w for w in cluster.workers if w is not night.replacement or any(w.models.rglob(COMPLETE_MARKER))]
    for worker in loading:
        copies = list(worker.models.rglob(COMPLETE_MARKER))
        assert len(copies) == 1, worker.name
        assert _weights(copies[0].parent), f"{worker.name} has no weights in its own cache"
        cache = worker.models / Path(MODEL_CACHE_DIR).relative_to(MODELS_DIR)
        fetches = (cache / FETCH_LOG).read_text().splitlines()
        assert len(fetches) == 1, (worker.name, per_node[worker.name], fetches)
    assert max(per_node.values()) >= 2, per_node  # a node whose several loading actors shared one fetch
    print(
        f"model-loading actors per node {dict(per_node)}; one fetch on each of {len(loading)} workers; the new "
        f"worker {'loaded the model' if night.replacement in loading else 'joined after the work had gone'}"
    )
    assert cluster.head is not None
    assert not _weights(cluster.head.models), "the head fetched weights"


def test_a_lost_worker_costs_only_its_work_in_flight(cluster: cluster_box.Cluster, night: Night) -> None:
    """The run finished without the lost worker: its engine batches in flight were rerun on a live worker (the new
    one or the survivor), every other batch was answered once, and every row was written once."""
    assert night.status == "SUCCEEDED", night.logs[-6000:]
    # The lost worker is dead; so may be a start of the new pod's that gave up (cluster_box.wait_for_nodes).
    dead = {n["node_id"]: (n.get("labels") or {}).get(cluster_box.POD_LABEL) for n in cluster.all_nodes()
            if n["state"] == "DEAD"}  # fmt: skip
    assert night.lost_id in dead and set(dead.values()) <= {night.lost.name, night.replacement.name}, dead
    # The new pod joined with the manifest's flags, whether or not work was left for it: a worker group back at size.
    cluster.wait_for_nodes(len(cluster.workers), timeout_s=120)  # the head and every worker but the lost one
    alive = {_name(cluster, n["node_id"]) for n in cluster.alive_nodes()}
    assert night.replacement.name in alive, alive
    # Each attempt of a batch is a task record; those Ray made while the actor was unreachable or restarting
    # failed at once. The attempt that answered a rerun batch ran on a live worker: the new one, or the survivor
    # when its engine was free first.
    answered = [t for t in _engine_batches(cluster) if t["state"] == "FINISHED"]
    # A batch answered again: rerun after its attempt died with the node, or recomputed because its answer was
    # only in the lost node's object store.
    rerun = [t for t in answered if t["attempt_number"] > 0]
    live = {night.replacement.name, *(w.name for w in _survivors(cluster, night))}
    assert {_name(cluster, t["node_id"]) for t in rerun} <= live, (live, rerun)
    # One engine batch per input file (asserted), so the rows re-done are the rerun batches' files.
    assert len({t["task_id"] for t in answered}) == FILES
    bucket, prefix = night.output[len("s3://") :].split("/", 1)
    manifest = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=f"{prefix}_manifest.json")["Body"].read())
    (attempt,) = manifest["attempts"]
    print(
        f"lost node: {len(rerun)} of {FILES} engine batches rerun "
        f"{dict(Counter(_name(cluster, t['node_id']) for t in rerun))}, {len(rerun) * FILE_ROWS} of "
        f"{ROWS} rows re-done; {attempt['rows_redelivered']} rows reached the driver twice and were dropped"
    )
    assert rerun, "no engine batch was in flight on the lost worker: it was killed too late to test anything"
    assert len(rerun) < FILES, "every batch was re-done: the loss cost more than the work in flight"
