"""Where the model comes from: the embedded tiny model, a local folder, an s3:// prefix, a hub id offline; and an
s3:// model fetched once per node (lock, whole-folder rename, ranged reads), on a moto server."""

from __future__ import annotations

import json
import multiprocessing
import uuid
from pathlib import Path

import boto3
import pytest

from workload.contract.config import ModelConfig
from workload.engine import model_source
from workload.engine.model_source import ModelSourceError, compile_cache_env, resolve_model
from workload.engine.tiny_model import TINY_MODEL_VERSION


def test_embedded_model_is_built_once_with_4096_positions(tmp_path) -> None:
    first = resolve_model(ModelConfig(cache_dir=str(tmp_path)))
    config = json.loads((tmp_path / TINY_MODEL_VERSION / "config.json").read_text())
    assert config["max_position_embeddings"] >= 4096
    assert config["hidden_size"] // config["num_attention_heads"] in {32, 64}  # what vLLM's CPU attention takes
    built = (tmp_path / TINY_MODEL_VERSION / "config.json").stat().st_mtime_ns
    assert resolve_model(ModelConfig(cache_dir=str(tmp_path))) == first
    assert (tmp_path / TINY_MODEL_VERSION / "config.json").stat().st_mtime_ns == built  # cached, not rebuilt


def test_s3_prefix_is_copied_into_the_cache(tmp_path, moto_endpoint) -> None:
    source = resolve_model(ModelConfig(cache_dir=str(tmp_path / "build")))
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for file in sorted(p for p in Path(source).iterdir() if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"tiny/{file.name}", Body=file.read_bytes())
    local = resolve_model(ModelConfig(source=f"s3://{bucket}/tiny", cache_dir=str(tmp_path / "cache")))
    assert (tmp_path / "cache") in Path(local).parents
    assert json.loads((Path(local) / "config.json").read_text())["architectures"]


def test_hub_id_without_network_fails_fast_and_says_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="hub id") as caught:
        resolve_model(ModelConfig(source="meta-llama/Llama-3.1-8B-Instruct", cache_dir=str(tmp_path)))
    assert "local path or s3://" in str(caught.value)


def test_missing_local_folder_is_named(tmp_path) -> None:
    with pytest.raises(ModelSourceError, match="no such local folder"):
        resolve_model(ModelConfig(source=str(tmp_path / "nope"), cache_dir=str(tmp_path)))
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        resolve_model(ModelConfig(source=str(tmp_path), cache_dir=str(tmp_path)))


# --- one fetch per node ----------------------------------------------------------------------------------------


@pytest.fixture
def s3_model(tmp_path: Path, moto_endpoint: str) -> tuple[str, Path]:
    """The tiny model under an s3:// prefix on the moto server, with a weights file large enough for ranged GETs
    at the part size the tests set (256 KiB)."""
    source = Path(resolve_model(ModelConfig(cache_dir=str(tmp_path / "build"))))
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"tiny/{file.name}", Body=file.read_bytes())
    return f"s3://{bucket}/tiny", source


@pytest.fixture
def get_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every GetObject the code under test sends (key and Range), one JSON line each, from any process forked
    after this: boto3's own event hooks on the session its clients come from."""
    log = tmp_path / "gets.jsonl"
    session = boto3.session.Session()
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)

    def record(params: dict, **_: object) -> None:
        with open(log, "a") as handle:
            handle.write(json.dumps({"key": params["Key"], "range": params.get("Range")}) + "\n")

    session.events.register("provide-client-params.s3.GetObject", record)
    monkeypatch.setattr(model_source, "PART_BYTES", 256 * 2**10)
    return log


def _gets(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_large_files_come_as_parallel_ranged_reads_into_a_whole_folder(tmp_path, s3_model, get_log) -> None:
    uri, original = s3_model
    local = Path(resolve_model(ModelConfig(source=uri, cache_dir=str(tmp_path / "node"))))
    weights = next(p.name for p in original.iterdir() if p.suffix == ".safetensors")
    assert (original / weights).stat().st_size > 3 * 256 * 2**10  # several parts at 256 KiB
    for file in original.iterdir():
        if file.is_file():
            assert (local / file.name).read_bytes() == file.read_bytes(), file.name
    ranges = [g["range"] for g in _gets(get_log) if g["key"].endswith(weights)]
    assert len(ranges) >= 3 and all(r and r.startswith("bytes=") for r in ranges)
    assert (local / model_source.COMPLETE_MARKER).is_file()
    # Nothing half-made is left beside it.
    assert [p.name for p in local.parent.iterdir()] == [local.name]


def _resolve_in_child(uri: str, cache: str, out: str) -> None:
    Path(out).write_text(resolve_model(ModelConfig(source=uri, cache_dir=cache)))


def test_actors_on_one_node_share_one_download(tmp_path, s3_model, get_log) -> None:
    """Four processes (the actors of one node) ask at once: one downloads, the others wait and reuse it."""
    uri, _ = s3_model
    cache = str(tmp_path / "node")
    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=_resolve_in_child, args=(uri, cache, str(tmp_path / f"out{i}"))) for i in range(4)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    paths = {(tmp_path / f"out{i}").read_text() for i in range(4)}
    assert len(paths) == 1
    config_gets = [g for g in _gets(get_log) if g["key"].endswith("/config.json")]
    assert len(config_gets) == 1  # fetched once, not once per actor
    # A later actor start (a restarted engine) finds it complete and downloads nothing.
    before = len(_gets(get_log))
    assert resolve_model(ModelConfig(source=uri, cache_dir=cache)) in paths
    assert len(_gets(get_log)) == before
    # The node's fetch log holds that one fetch, with what it took.
    (fetch,) = [json.loads(line) for line in (Path(cache) / model_source.FETCH_LOG).read_text().splitlines()]
    assert fetch["source"] == uri and fetch["bytes"] > 0 and fetch["seconds"] >= 0


def test_a_killed_download_is_never_taken_for_a_model(tmp_path, s3_model, get_log) -> None:
    uri, _ = s3_model
    config = ModelConfig(source=uri, cache_dir=str(tmp_path / "node"))
    target = Path(model_source.model_label(config))
    # What a download killed halfway by the old code, or by hand, leaves: the folder without its marker.
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    local = Path(resolve_model(config))
    assert local == target and json.loads((local / "config.json").read_text())["architectures"]
    assert _gets(get_log)  # fetched again
    # The prefix changes (a new file): the node's copy is replaced, not reused.
    bucket, prefix = uri[len("s3://") :].split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/generation_config.json", Body=b"{}")
    assert (Path(resolve_model(config)) / "generation_config.json").is_file()


def test_the_driver_names_the_model_without_touching_storage(tmp_path) -> None:
    """`model_label` is what the driver passes to Ray Data LLM: a path each node will fill, not a download."""
    config = ModelConfig(source="s3://no-such-bucket/models/x", cache_dir=str(tmp_path))
    assert model_source.model_label(config) == str(tmp_path / "s3" / "no-such-bucket" / "models" / "x")
    assert not any(tmp_path.iterdir())
    assert model_source.model_label(ModelConfig(source="org/model", cache_dir=str(tmp_path))) == "org/model"


def test_a_prefix_that_is_no_model_is_named(tmp_path, s3_model) -> None:
    uri, _ = s3_model
    bucket = uri[len("s3://") :].split("/", 1)[0]
    boto3.client("s3").put_object(Bucket=bucket, Key="notes/readme.txt", Body=b"hi")
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        resolve_model(ModelConfig(source=f"s3://{bucket}/notes", cache_dir=str(tmp_path / "node")))
    with pytest.raises(ModelSourceError, match="no files under that prefix"):
        resolve_model(ModelConfig(source=f"s3://{bucket}/nothing", cache_dir=str(tmp_path / "node")))


def test_compile_caches_live_beside_the_model_cache(tmp_path: Path) -> None:
    """A resume or a restarted container on the node finds the compile caches where the model cache is."""
    env = compile_cache_env(ModelConfig(cache_dir=str(tmp_path / "models")))
    assert env == {
        "VLLM_CACHE_ROOT": str(tmp_path / "models" / "compile" / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "models" / "compile" / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "models" / "compile" / "triton"),
    }
    assert all(Path(path).is_dir() for path in env.values())


def test_an_unwritable_cache_leaves_the_compile_caches_to_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("a file where the cache folder should be")
    assert compile_cache_env(ModelConfig(cache_dir=str(blocker))) == {}
    assert "compile caches stay in the run's scratch folder" in capsys.readouterr().err


def test_a_sharded_model_is_fetched_per_file_and_per_part(tmp_path, s3_model, monkeypatch) -> None:
    """Two weight shards of many parts each: more ranged GETs are in flight at once than one file's 16, up to the
    pool sized for both files (s3transfer's max_concurrency is one pool for the whole transfer). A boto3 hook holds
    each GET until both files and more than one file's 16 requests are in flight (or 2 s pass), so the overlap is
    measured whatever the machine's load, not left to the moto server's speed or how fast a busy machine starts
    threads."""
    import threading

    uri, original = s3_model
    weights = next(p for p in original.iterdir() if p.suffix == ".safetensors")
    bucket, prefix = uri.removeprefix("s3://").split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/shard-2.safetensors", Body=weights.read_bytes())
    monkeypatch.setattr(model_source, "PART_BYTES", 32 * 2**10)  # 32 parts per shard
    session = boto3.session.Session()
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)
    lock = threading.Condition()
    in_flight, peak = {"now": 0}, {"all": 0, "files": 0}
    keys_in_flight: dict[str, int] = {}

    def before(params: dict, **_: object) -> None:
        with lock:
            in_flight["now"] += 1
            keys_in_flight[params["Key"]] = keys_in_flight.get(params["Key"], 0) + 1
            peak["all"] = max(peak["all"], in_flight["now"])
            shards = sum(1 for key, n in keys_in_flight.items() if n > 0 and key.endswith(".safetensors"))
            peak["files"] = max(peak["files"], shards)
            lock.notify_all()
            # Held until the pool shows both files and more than 16 requests at once; the old single pool of 16
            # never gets there, and each of its GETs then waits the 2 s out (the test fails on its peak).
            lock.wait_for(lambda: peak["all"] > model_source.PARALLEL_REQUESTS and peak["files"] == 2, timeout=2.0)
        with lock:
            in_flight["now"] -= 1
            keys_in_flight[params["Key"]] -= 1

    session.events.register("provide-client-params.s3.GetObject", before)
    local = Path(resolve_model(ModelConfig(source=uri, cache_dir=str(tmp_path / "node"))))
    assert (local / "shard-2.safetensors").read_bytes() == weights.read_bytes()
    listing = model_source._model_listing(boto3.client("s3"), uri)
    assert model_source.request_pool_size(listing) == 2 * model_source.PARALLEL_REQUESTS
    assert model_source.PARALLEL_REQUESTS < peak["all"] <= 2 * model_source.PARALLEL_REQUESTS
    assert peak["files"] == 2


def test_the_request_pool_grows_with_shards_up_to_its_cap() -> None:
    big, small = model_source.PART_BYTES + 1, 1000

    def files(sizes: list[int]) -> list:
        return [model_source._Remote(f"k{i}", f"f{i}", size, "e") for i, size in enumerate(sizes)]

    assert model_source.request_pool_size(files([small, small])) == model_source.PARALLEL_REQUESTS
    assert model_source.request_pool_size(files([big, big, big, small])) == 3 * model_source.PARALLEL_REQUESTS
    cap = model_source.FILES_AT_ONCE * model_source.PARALLEL_REQUESTS
    assert model_source.request_pool_size(files([big] * 30)) == cap
