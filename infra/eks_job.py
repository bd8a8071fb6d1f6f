"""The nightly RayJob of the EKS tiers, rendered from the stack's typed config.

`base_rayjob_args` is what the program exports (`rayjob_args`, JSON); the nightly submitter rebuilds it with
`RayJobArgs.model_validate_json` and renders one night's objects with `manifests_for_date` (or
`night_manifests` for URIs of its own).
"""

from __future__ import annotations

import re

from infra import naming, versions
from infra.config import StackConfig
from infra.k8s.common import POOL_LABEL, Manifest
from infra.k8s.model_disk import models_volume
from infra.k8s.rayjob import HeadSpec, RayJobArgs, WorkerSpec, fit_job_to_workers, for_night, render_job
from infra.pricing.stack_costs import run_price_per_hour_usd
from workload.contract.config import build_config

RAYJOB_NAME = "llm-batch"
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def base_rayjob_args(
    config: StackConfig, stack: str, image: str, bucket: str, hub_token_secret_arn: str | None = None
) -> RayJobArgs:
    """The RayJob every night starts from; input and output carry the `{date}` the night fills in."""
    eks = config.eks
    autoscaling = eks.karpenter_enabled
    # The group the model's engine needs (infra/config/worker_groups.py): one-GPU or eight-GPU workers.
    group = config.night_workers
    workers = WorkerSpec(
        size=group.size,
        # One copy of the weights and the compile caches, from the model's size (engine-plan's weights_gib).
        models_volume=models_volume(config.job.model_weights_gib),
        min_replicas=group.min_workers if autoscaling else group.max_nodes,
        max_replicas=group.max_nodes,
        node_selector={POOL_LABEL: group.name},
        group_name=group.name,
    )
    job = config.job_config(
        f"s3://{bucket}/{config.job.input_prefix}",
        f"s3://{bucket}/{config.job.output_prefix}",
        stack=stack,
        price_per_hour_usd=run_price_per_hour_usd(config),
    )
    if job.metrics.log_group is None:
        # The pods ship their logs to the stack's job log group, as the small tier's node does.
        job = build_config(job.model_dump(mode="json"), {"metrics.log_group": naming.job_log_group(stack)})
    job = fit_job_to_workers(job, workers)
    return RayJobArgs(
        name=RAYJOB_NAME,
        cluster=RAYJOB_NAME,
        namespace=eks.namespace,
        image=image,
        service_account=eks.service_account,
        worker_service_account=eks.worker_service_account,
        ray_version=versions.RAY_VERSION,
        job=job,
        head=HeadSpec(size=eks.head_size),
        workers=workers,
        autoscaling=autoscaling,
        active_deadline_s=config.schedule.run_deadline_minutes * 60,
        backoff_limit=eks.job_backoff_limit,
        ttl_after_finished_s=eks.job_ttl_after_finished_s,
        protect_from_consolidation=eks.karpenter_enabled,
        labels={"llm-batch.io/stack": stack},
        hub_token_secret_arn=hub_token_secret_arn,
    )


def night_manifests(base: RayJobArgs, *, run_id: str, input_uri: str, output_uri: str) -> list[Manifest]:
    """The ConfigMap and RayJob of one night, in creation order."""
    return render_job(for_night(base, run_id=run_id, input_uri=input_uri, output_uri=output_uri))


def manifests_for_date(base: RayJobArgs, date: str) -> list[Manifest]:
    """One night's objects for a UTC date (`2026-11-29`): `{date}` in the base input and output filled in,
    the RayJob named `<base name>-<date>`."""
    if not _DATE.match(date):
        raise ValueError(f"date {date!r} must be YYYY-MM-DD")
    return night_manifests(
        base,
        run_id=date,
        input_uri=base.job.input.uri.replace("{date}", date),
        output_uri=base.job.output.uri.replace("{date}", date),
    )
