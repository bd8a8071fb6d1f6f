"""Turn `model.source` into a local folder vLLM can load: embedded tiny model, local path, s3:// prefix or hub id."""

from __future__ import annotations

import os
from pathlib import Path

from workload.config import ModelConfig
from workload.storage import StorageError, list_files, locate, read_bytes, size_of, write_bytes_atomic
from workload.tiny_model import ensure_tiny_model


class ModelSourceError(RuntimeError):
    """The model cannot be had; raised before any engine starts."""


def _cache_root(config: ModelConfig) -> Path:
    return Path(os.path.expanduser(config.cache_dir))


def _from_s3(uri: str, cache: Path) -> Path:
    """Copy an s3:// prefix once into the cache (files already there with the same size are kept)."""
    source = locate(uri)
    target = cache / "s3" / source.path
    try:
        files = list_files(source)
    except (OSError, StorageError) as error:
        raise ModelSourceError(f"model.source {uri}: cannot list it: {error}") from error
    if not files:
        raise ModelSourceError(f"model.source {uri}: no files under that prefix")
    root = source.path.rstrip("/")
    for file in files:
        relative = file.path[len(root) + 1 :]
        local = target / relative
        size = size_of(file)
        if local.is_file() and local.stat().st_size == size:
            continue
        write_bytes_atomic(locate(str(local)), read_bytes(file))
    if not (target / "config.json").is_file():
        raise ModelSourceError(f"model.source {uri}: no config.json under that prefix; is it a model folder?")
    return target


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
        return Path(snapshot_download(repo_id, cache_dir=hub_cache))
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise ModelSourceError(
            f"model.source {repo_id!r}: cannot download it from the Hugging Face hub "
            f"({type(error).__name__}: {error}). With no network, use a local path or an s3:// prefix."
        ) from None


def resolve_model(config: ModelConfig) -> str:
    """A local folder holding the model's config and tokenizer (and weights, unless load_format is dummy)."""
    cache = _cache_root(config)
    source = config.source
    if source is None:
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
    return str(_from_hub(source, cache))
