"""The nightly RayJob of the EKS tiers, rendered from the stack's typed config.

`base_rayjob_args` is what the program exports (`rayjob_args`, JSON); the nightly submitter rebuilds it with
`RayJobArgs.model_validate_json` and renders one night's objects with `night_manifests`.
"""

from __future__ import annotations

from infra import naming, versions
from infra.config import StackConfig
from infra.k8s.common import Manifest
from infra.k8s.rayjob import HeadSpec, RayJobArgs, WorkerSpec, fit_job_to_workers, for_night, render_job

RAYJOB_NAME = "llm-batch"


def base_rayjob_args(config: StackConfig, stack: str, image: str, bucket: str) -> RayJobArgs:
    """The RayJob every night starts from; input and output carry the `{date}` the night fills in."""
    eks = config.eks
    autoscaling = eks.karpenter_enabled
    workers = WorkerSpec(
        size=eks.worker_size,
        min_replicas=eks.gpu_min_workers if autoscaling else eks.gpu_max_nodes,
        max_replicas=eks.gpu_max_nodes,
    )
    job = config.job_config(
        input_uri=f"s3://{bucket}/{config.job.input_prefix}",
        output_uri=f"s3://{bucket}/{config.job.output_prefix}",
    )
    job = fit_job_to_workers(
        job.model_copy(
            update={
                "metrics": job.metrics.model_copy(
                    update={"stack": stack, "log_group": naming.job_log_group(stack)}
                )
            }
        ),
        workers,
    )
    return RayJobArgs(
        name=RAYJOB_NAME,
        namespace=eks.namespace,
        image=image,
        service_account=eks.service_account,
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
    )


def night_manifests(base: RayJobArgs, *, run_id: str, input_uri: str, output_uri: str) -> list[Manifest]:
    """The ConfigMap and RayJob of one night, in creation order."""
    return render_job(for_night(base, run_id=run_id, input_uri=input_uri, output_uri=output_uri))
