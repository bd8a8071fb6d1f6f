"""The online endpoint's RayService, rendered from the stack's typed config (`serve.*`, the job's model and engine).

The program applies what `rayservice_manifest` returns; tests validate it against KubeRay's RayService CRD.
"""

from __future__ import annotations

from infra import versions
from infra.config import StackConfig
from infra.k8s.common import Manifest
from infra.k8s.model_disk import models_volume
from infra.k8s.rayservice import RayServiceArgs, render_rayservice, workers_for

RAYSERVICE_NAME = "llm-batch-serve"
# The endpoint's own accounts (infra/components/serve_identity.py), not the nightly job's: only their roles may
# read the endpoint's API keys (issue 60).
SERVICE_ACCOUNT = "llm-batch-serve"
WORKER_SERVICE_ACCOUNT = "llm-batch-serve-worker"


def rayservice_args(
    config: StackConfig,
    stack: str,
    image: str,
    hub_token_secret_arn: str | None = None,
    api_keys_secret_arn: str | None = None,
) -> RayServiceArgs:
    eks, serve = config.eks, config.serve
    return RayServiceArgs(
        name=RAYSERVICE_NAME,
        namespace=eks.namespace,
        image=image,
        service_account=SERVICE_ACCOUNT,
        worker_service_account=WORKER_SERVICE_ACCOUNT,
        ray_version=versions.RAY_VERSION,
        serve=config.serve_config(api_keys_secret_arn),
        min_replicas=serve.min_replicas,
        max_replicas=serve.max_replicas,
        target_ongoing_requests=serve.target_ongoing_requests,
        head_size=serve.head_size,
        worker_size=serve.worker_size,
        worker_models_volume=models_volume(config.job.model_weights_gib),
        internal_load_balancer=serve.internal_load_balancer,
        # Karpenter must never consolidate a node out from under a replica serving requests; when Serve scales a
        # replica away, its worker pod goes and the empty node is removed as usual.
        protect_from_consolidation=eks.karpenter_enabled,
        labels={"llm-batch.io/stack": stack},
        hub_token_secret_arn=hub_token_secret_arn,
        stack=stack,
        metrics_namespace=config.monitoring.metrics_namespace,
        region=config.region,
    )


def rayservice_manifest(
    config: StackConfig,
    stack: str,
    image: str,
    hub_token_secret_arn: str | None = None,
    api_keys_secret_arn: str | None = None,
) -> Manifest:
    return render_rayservice(rayservice_args(config, stack, image, hub_token_secret_arn, api_keys_secret_arn))


def serve_worker_ceiling(config: StackConfig) -> int:
    """The most GPU worker pods the endpoint may hold at once: `serve.max_replicas` worth, plus `serve.min_replicas`
    worth for the new cluster KubeRay brings up beside the old one while it upgrades the RayService (a new image
    or cluster spec; its default `NewCluster` strategy switches traffic only once the new cluster serves)."""
    serve = config.serve
    tp = config.serve_config().engine.tensor_parallel_size
    return workers_for(serve.max_replicas, serve.worker_size.gpus, tp) + workers_for(
        serve.min_replicas, serve.worker_size.gpus, tp
    )
