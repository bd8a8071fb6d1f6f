"""Turn `model.source` into a local folder vLLM can load: embedded tiny model, local path, s3:// prefix or hub id.

Where this runs: on every node that runs an engine, tokenizer or chat-template actor, inside that actor, never on
the driver. On a Ray cluster the driver sits on a head node that runs no actor, and each worker (a pod, an
instance) has its own disk: a folder the driver filled would be on the wrong machine. So each node fetches the
model into its own `model.cache_dir`, once: the first actor on the node takes a file lock and downloads into a
staging folder that is renamed into place whole; the other actors on that node wait on the lock and then find
the finished folder. A download killed halfway leaves only a staging folder, never a model that looks whole.

s3:// files go through boto3's transfer manager: each large file is fetched as parallel ranged GETs written
straight to disk (never whole in memory), several files at once: the manager's request pool is sized to
`PARALLEL_REQUESTS` per file for up to `FILES_AT_ONCE` files (s3transfer's `max_concurrency` is one pool for the
whole transfer, not a number per file).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload.contract.config import ModelConfig
from workload.engine.tiny_model import TINY_MODEL_VERSION, ensure_tiny_model
from workload.files.storage import StorageError, locate

# Written last into a finished s3:// copy: the listing it was made from. A folder without it is not a model.
COMPLETE_MARKER = ".llm-batch-complete.json"
# One JSON line per s3:// fetch this node made (source, bytes, seconds): the node's own load-time figures, and what
# shows that the actors of a node fetched the model once (docs/model-and-nodes.md).
FETCH_LOG = ".fetches.jsonl"
# Parts of 32 MiB, 16 in flight per file: near S3's per-connection throughput at a few hundred MiB in memory
# at most (s3transfer bounds its queues), for files from a few MiB to tens of GiB.
PART_BYTES = 32 * 2**20
PARALLEL_REQUESTS = 16
# Safetensors shards fetched side by side. AWS's S3 performance guidelines ("Horizontally scale storage
# connections") suggest one request per 85-90 MB/s wanted: 8 x 16 = 128 ranged GETs in flight is about 11 GB/s,
# more than any tier's model disk writes (a p4d's RAID0 of instance-store NVMe, docs/model-and-nodes.md);
# a one-shard model gets 16.
FILES_AT_ONCE = 8


class ModelSourceError(RuntimeError):
    """The model cannot be had; raised before any engine starts."""


@dataclass(frozen=True)
class _Remote:
    key: str
    relative: str
    size: int
    etag: str


def request_pool_size(files: list[_Remote]) -> int:
    """Ranged GETs in flight for a fetch of `files`: `PARALLEL_REQUESTS` for each multipart file, up to
    `FILES_AT_ONCE` files, and never fewer than `PARALLEL_REQUESTS` (a folder of small files)."""
    multipart = sum(1 for file in files if file.size > PART_BYTES)
    return PARALLEL_REQUESTS * max(1, min(multipart, FILES_AT_ONCE))


def _cache_root(config: ModelConfig) -> Path:
    return Path(os.path.expanduser(config.cache_dir))


# The compile caches an engine start reads and writes, by the folder each gets under `<cache_dir>/compile/`.
COMPILE_CACHE_FOLDERS = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def compile_cache_env(config: ModelConfig) -> dict[str, str]:
    """The environment that points vLLM's and torch's caches (compiled graphs and kernels, vLLM's model-class
    inspection) into this node's model cache, which lives as long as the node: a resume or a restarted container
    on the same node starts from them instead of compiling again. Empty, with a warning, where the folder cannot
    be made: the engine then keeps the run's scratch folders, as before."""
    root = _cache_root(config) / "compile"
    env: dict[str, str] = {}
    try:
        for variable, folder in COMPILE_CACHE_FOLDERS.items():
            path = root / folder
            path.mkdir(parents=True, exist_ok=True)
            env[variable] = str(path)
    except OSError as error:
        print(f"[llm-batch] compile caches stay in the run's scratch folder: {error}", file=sys.stderr)
        return {}
    return env


def is_hub_id(source: str | None) -> bool:
    """Whether `model.source` names a Hugging Face hub repository (owner/name) rather than a folder or prefix."""
    if source is None or source.startswith("s3://") or source.startswith((".", "/", "~")):
        return False
    return source.count("/") == 1 and not Path(source).expanduser().exists()


def model_label(config: ModelConfig) -> str:
    """What names the model before any node has it, without touching storage: the folder each node will hold
    it in (the same path on every node), or the hub id. Ray Data LLM records it (telemetry) and vLLM serves
    under it; nothing is downloaded for it."""
    cache, source = _cache_root(config), config.source
    if source is None:
        return str(cache / TINY_MODEL_VERSION)
    if source.startswith("s3://"):
        return str(cache / "s3" / locate(source).path)
    return source if is_hub_id(source) else str(Path(source).expanduser().resolve())


@contextmanager
def _node_lock(cache: Path, source: str) -> Iterator[None]:
    """One fetch of `source` at a time on this node; the kernel drops the lock if the holder dies."""
    locks = cache / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(source.encode()).hexdigest()[:16]
    with open(locks / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _s3_client(parallel: int) -> Any:
    import boto3
    from botocore.config import Config

    # A connection per concurrent part request, and retries with backoff for a throttled or reset GET.
    return boto3.client(
        "s3", config=Config(max_pool_connections=parallel + 4, retries={"mode": "adaptive", "max_attempts": 5})
    )


def _list_remote(client: Any, uri: str) -> list[_Remote]:
    from botocore.exceptions import BotoCoreError, ClientError

    source = locate(uri)
    folder = source.key.rstrip("/") + "/" if source.key else ""
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=source.bucket, Prefix=folder)
        objects = [obj for page in pages for obj in page.get("Contents", [])]
    except (BotoCoreError, ClientError) as error:
        raise ModelSourceError(f"model.source {uri}: cannot list it: {error}") from error
    return sorted(
        (
            _Remote(obj["Key"], obj["Key"][len(folder) :], int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))
            for obj in objects
            if not obj["Key"].endswith("/")
        ),
        key=lambda remote: remote.key,
    )


def _listing(files: list[_Remote]) -> list[list[Any]]:
    return [[f.relative, f.size, f.etag] for f in files]


def _is_complete(target: Path, files: list[_Remote]) -> bool:
    try:
        recorded = json.loads((target / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded.get("files") == _listing(files))


def _download_all(client: Any, bucket: str, files: list[_Remote], staging: Path) -> None:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    transfer = TransferConfig(
        multipart_threshold=PART_BYTES,
        multipart_chunksize=PART_BYTES,
        max_concurrency=request_pool_size(files),
    )
    with create_transfer_manager(client, transfer) as manager:
        futures = []
        for file in files:
            local = staging / file.relative
            local.parent.mkdir(parents=True, exist_ok=True)
            futures.append((file, manager.download(bucket, file.key, str(local))))
        for file, future in futures:
            try:
                future.result()
            except Exception as error:
                raise ModelSourceError(f"model.source s3://{bucket}/{file.key}: download failed: {error}") from error
    for file in files:
        got = (staging / file.relative).stat().st_size
        if got != file.size:
            raise ModelSourceError(f"model.source s3://{bucket}/{file.key}: got {got} bytes of {file.size}")


def _model_listing(client: Any, uri: str, required: str = "config.json", what: str = "model.source") -> list[_Remote]:
    """The files under an s3:// prefix, refused unless they look like a model folder (an adapter's: `required`)."""
    files = _list_remote(client, uri)
    if not files:
        raise ModelSourceError(f"{what} {uri}: no files under that prefix")
    if required not in {f.relative for f in files}:
        raise ModelSourceError(f"{what} {uri}: no {required} under that prefix; is it a model folder?")
    return files


def _from_s3(uri: str, cache: Path, required: str = "config.json", what: str = "model.source") -> Path:
    """This node's copy of an s3:// prefix, fetched once and kept while the prefix lists the same files."""
    try:
        source = locate(uri)
    except StorageError as error:
        raise ModelSourceError(f"{what} {uri}: {error}") from error
    target = cache / "s3" / source.path
    files = _model_listing(_s3_client(PARALLEL_REQUESTS), uri, required, what)
    client = _s3_client(request_pool_size(files))
    if _is_complete(target, files):
        return target
    with _node_lock(cache, uri):
        if _is_complete(target, files):  # another actor on this node fetched it while we waited
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        started = time.monotonic()
        try:
            _download_all(client, source.bucket, files, staging)
            (staging / COMPLETE_MARKER).write_text(json.dumps({"source": uri, "files": _listing(files)}))
            if target.exists():  # an older copy (the prefix changed since): set it aside, then swap
                stale = Path(tempfile.mkdtemp(prefix=f".{target.name}-stale-", dir=target.parent))
                os.rename(target, stale / "model")
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(staging, target)  # atomic: other actors see the whole model or none
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _record_fetch(cache, uri, sum(f.size for f in files), time.monotonic() - started)
    return target


def _record_fetch(cache: Path, uri: str, size: int, seconds: float) -> None:
    # Appended under the node lock, so lines from the node's actors never interleave.
    line = {"source": uri, "bytes": size, "seconds": round(seconds, 3), "pid": os.getpid(), "at": time.time()}
    with open(cache / FETCH_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


def _from_hub(repo_id: str, cache: Path) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    hub_cache = cache / "hub"
    try:
        return Path(snapshot_download(repo_id, cache_dir=hub_cache, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelSourceError(
            f"model.source {repo_id!r} is a hub id, it is not in the cache ({hub_cache}) and HF_HUB_OFFLINE=1; "
            "download it where there is network, or point model.source at a local path or s3:// prefix"
        )
    try:
        # A short timeout: with no network this fails in seconds instead of stalling a GPU node.
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
        # The hub client streams each file to an .incomplete file and renames it, with parallel file downloads.
        return Path(snapshot_download(repo_id, cache_dir=hub_cache))
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise ModelSourceError(
            f"model.source {repo_id!r}: cannot download it from the Hugging Face hub "
            f"({type(error).__name__}: {error}). With no network, use a local path or an s3:// prefix."
        ) from None


def resolve_model(config: ModelConfig) -> str:
    """This node's local folder holding the model's config and tokenizer (and weights, unless load_format is
    dummy), fetching it into `config.cache_dir` first if this node does not have it yet."""
    cache = _cache_root(config)
    source = config.source
    if source is None:
        with _node_lock(cache, TINY_MODEL_VERSION):  # one build per node, not one per actor
            return str(ensure_tiny_model(cache))
    if source.startswith("s3://"):
        return str(_from_s3(source, cache))
    local = Path(source).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelSourceError(f"model.source {source}: the folder has no config.json")
        return str(local.resolve())
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise ModelSourceError(f"model.source {source}: no such local folder, and not a hub id (owner/name)")
    with _node_lock(cache, source):
        return str(_from_hub(source, cache))


def check_model_source(config: ModelConfig) -> None:
    """Refuse a `model.source` that cannot be a model, without fetching it: a folder without config.json, an
    s3:// prefix that lists no config.json (one LIST, no GETs), a name that is neither a folder nor a hub id.
    For a process that only plans the work (the local endpoint before it starts Ray), so a bad source stops
    before any engine starts; the nodes that run engines fetch the model themselves (`resolve_model`)."""
    source = config.source
    if source is None:
        return
    if source.startswith("s3://"):
        try:
            locate(source)
        except StorageError as error:
            raise ModelSourceError(f"model.source {source}: {error}") from error
        _model_listing(_s3_client(1), source)
        return
    local = Path(source).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelSourceError(f"model.source {source}: the folder has no config.json")
        return
    if not is_hub_id(source):
        raise ModelSourceError(f"model.source {source}: no such local folder, and not a hub id (owner/name)")


def resolve_folder(source: str, cache_dir: str, required: str, what: str) -> str:
    """This node's folder for a local folder or s3:// prefix that must hold `required` (a LoRA adapter's
    adapter_config.json: workload/engine/adapters.py), fetched into `cache_dir` once per node as the base model is.
    `what` names the setting in errors."""
    if source.startswith("s3://"):
        return str(_from_s3(source, _cache_root_of(cache_dir), required, what))
    local = Path(source).expanduser()
    if not local.is_dir():
        raise ModelSourceError(f"{what} {source}: no such local folder (give a folder or an s3:// prefix)")
    if not (local / required).is_file():
        raise ModelSourceError(f"{what} {source}: the folder has no {required}")
    return str(local.resolve())


def check_folder(source: str, required: str, what: str) -> None:
    """`resolve_folder`'s refusals without a download (one LIST for an s3:// prefix): for the planning process."""
    if source.startswith("s3://"):
        try:
            locate(source)
        except StorageError as error:
            raise ModelSourceError(f"{what} {source}: {error}") from error
        _model_listing(_s3_client(1), source, required, what)
        return
    resolve_folder(source, "", required, what)


def _cache_root_of(cache_dir: str) -> Path:
    return Path(os.path.expanduser(cache_dir))
