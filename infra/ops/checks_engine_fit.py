"""Does the stack's model fit the GPUs its nightly run may get? Decided from the model's config.json alone, with
the job's own sizing (workload/contract/engine_sizing.py), before anything is deployed.

The weights counted there are also held against `job.model_weights_gib`, which sizes the workers' /models volume
(infra/k8s/model_disk.py): a stated size below them is refused.

Run by `python -m infra.plan` and `python -m infra.preflight` when the config.json is on this machine: a local
model folder, or a hub id in the Hugging Face cache (`HF_HUB_CACHE`, `HF_HOME/hub` or ~/.cache/huggingface/hub).
An s3:// model, or a hub id not cached here, is named as not checked (the engines size themselves at start
anyway, and fail there with the same message). Every GPU instance type the run may launch is checked: Karpenter
may pick any type of its NodePool.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from infra.config import StackConfig
from infra.k8s.model_disk import GIB, disk_problem
from infra.pricing.stack_costs import capacity_pools
from infra.pricing.table import PriceTable
from workload.contract.engine_sizing import ModelShape, SizingError, kind_of_instance, plan_engine, read_model_config


@dataclass(frozen=True)
class EngineFit:
    ok: bool
    line: str


def cached_model_folder(source: str) -> Path | None:
    """The folder holding `source`'s config.json on this machine, or None."""
    local = Path(source).expanduser()
    if (local / "config.json").is_file():
        return local
    if source.startswith("s3://") or source.count("/") != 1:
        return None
    hub = Path(
        os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
    ).expanduser()
    snapshots = sorted((hub / f"models--{source.replace('/', '--')}" / "snapshots").glob("*/config.json"))
    return snapshots[-1].parent if snapshots else None


def _weights_problem(config: StackConfig, counted_gib: float) -> str | None:
    """The stated `job.model_weights_gib` (which sizes the /models volume) against the weights counted from the
    model's config.json; with none stated (the small tier allows it), the counted weights on the nodes' disks."""
    stated = config.job.model_weights_gib
    if stated is not None and stated < round(counted_gib, 1):
        return (
            f"job.model_weights_gib ({stated:g}) is less than the {counted_gib:.1f} GiB of weights counted from "
            f"{config.job.model_source}'s config.json: the /models volume would be too small; set it to "
            f"{counted_gib:.1f}"
        )
    if stated is None:
        for key, instance_type, root_volume_gib in config.model_nodes:
            if problem := disk_problem(round(counted_gib, 1), instance_type, root_volume_gib):
                return f"{config.job.model_source}: {problem} ({key})"
    return None


def check_engine_fit(config: StackConfig, prices: PriceTable) -> EngineFit:
    source = config.job.model_source
    if source is None:
        return EngineFit(True, "engine fit: the embedded tiny model (no model.source) fits any GPU")
    folder = cached_model_folder(source)
    if folder is None:
        return EngineFit(True, f"engine fit: not checked: {source}'s config.json is not on this machine")
    engine = config.job_config("s3://plan/input/", "s3://plan/output/").engine
    required, fallback = capacity_pools(config, prices)
    types = sorted({pool.instance_type for pool in (*required, *fallback) if kind_of_instance(pool.instance_type)})
    try:
        shape = ModelShape.from_config(read_model_config(folder), source)
    except SizingError as error:
        return EngineFit(False, f"engine fit: {error}")
    if problem := _weights_problem(config, shape.weight_bytes() / GIB):
        return EngineFit(False, f"engine fit: {problem}")
    lines = []
    for instance_type in types:
        gpus = prices.instance(config.region, instance_type).gpus
        try:
            plan = plan_engine(
                shape,
                kind_of_instance(instance_type) or "",
                gpus,
                max_model_len=engine.max_model_len,
                gpu_memory_utilization=engine.gpu_memory_utilization,
                row_tokens=engine.row_tokens,
                tensor_parallel_size=engine.tensor_parallel_size if engine.tensor_parallel_size > 1 else None,
            )
        except SizingError as error:
            return EngineFit(False, f"engine fit: on {instance_type}, which the stack's run may launch: {error}")
        lines.append(
            f"{instance_type}: {plan.engines_per_node} engine(s) x tp{plan.tensor_parallel_size}, "
            f"max_num_seqs {plan.max_num_seqs}, {plan.kv_cache_tokens:,} KV tokens"
        )
    return EngineFit(True, f"engine fit: {source}: " + "; ".join(lines))
