"""The online endpoint of the EKS tiers: a KubeRay RayService serving the nightly job's model.

Its Serve application is the one `python -m workload serve` runs (`workload.serve.cluster:app`, which builds it
with `workload.serve.app.build_app`) from the same config model (`workload.contract.serve_config.ServeConfig`), which
the
stack makes from the job's own model and engine sections (`StackConfig.serve_config`). Serve's HTTP proxy runs on
the head only (`proxy_location: HeadOnly`), behind KubeRay's serve Service: a ClusterIP Service, or by config an
internal load balancer, never an internet-facing one.

Replicas autoscale between `min_replicas` (0: no GPU node while idle) and `max_replicas`: Serve's autoscaler
asks for replicas, Ray's autoscaler (KubeRay's sidecar in the head) adds a worker pod per replica, and the node
pool of the endpoint (its own, never the nightly job's: `pool`) adds a GPU node for each.

The model lives where the engines run: each engine replica fetches it into its worker pod's own `/models` volume
(node disk, sized for the model, as the nightly job's workers have: `infra.k8s.rayjob`), with the job's code
(workload/serve/replica_model.py). The head builds the app from the model's label and fetches nothing: it has no
model volume and no hub token.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.k8s import hub_token
from infra.k8s.common import (
    DO_NOT_DISRUPT,
    GPU_POOL,
    HEAD_POOL,
    POOL_LABEL,
    WORKER_COMPONENT,
    Manifest,
    base_labels,
    check_dns_label,
    check_labels,
    check_quantity,
    gpu_toleration,
    quantity_value,
)
from infra.k8s.head_group import RAY_AUTOSCALER, SERVE_REPORTER
from infra.k8s.network_policy import SERVE_PORT, cluster_labels
from infra.k8s.ray_auth import auth_options
from infra.k8s.ray_head import head_template
from infra.k8s.rayjob import (
    RAY_API_VERSION,
    PodSize,
    WorkerSpec,
    _container_security,
    _models_volume,
    _pod_security,
    _shm_volume,
)
from workload.contract.entrypoint import MODELS_DIR
from workload.contract.serve_config import ServeConfig

# The application builder in the image: `app(args)` builds the Serve app from `args["config"]` (a ServeConfig).
APP_IMPORT_PATH = "workload.serve.cluster:app"
APP_NAME = "llm-batch"
# Ray Serve LLM names the engine deployment `LLMServer:<model id with / as -- and . as _>` (ray 2.60,
# ray/llm/_internal/serve/core/server/builder.py); the autoscaling override below addresses it by that name.
LLM_DEPLOYMENT_PREFIX = "LLMServer:"
# Read by Ray at import in every process, so they are the pods' environment (workload.serve.endpoint sets the
# same for a local endpoint): no HAProxy (Serve's own proxy behind KubeRay's Service). Prompts stay out of the logs
# because the endpoint's config refuses vLLM's request logging (workload.contract.serve_config).
SERVE_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "0",
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "0",
}
# Labels on the internal load balancer's Service: the AWS Load Balancer Controller reads the scheme; the in-tree
# cloud provider (no controller installed) reads the second. Either way: a load balancer with private addresses.
INTERNAL_LB_ANNOTATIONS = {
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
}
SERVE_POOL = "serve"
# Ray's Prometheus export on each node (KubeRay's default port, set here so the reporter can rely on it).
METRICS_PORT = 8080
SERVICE_COMPONENT = "rayservice"
# KubeRay names the RayCluster `<rayservice>-<5 chars>` and its Services after it: the same room as a RayJob's.
MAX_NAME = 40


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RayServiceArgs(_Strict):
    name: str = Field(description="RayService name; the serve Service is `<name>-serve-svc`.")
    namespace: str
    image: str = Field(description="The job image (pinned), which holds the Serve application.")
    service_account: str = Field(description="The head's service account (IRSA; KubeRay's autoscaler Role).")
    worker_service_account: str = Field(description="The GPU workers' account: no Kubernetes API token.")
    ray_version: str
    serve: ServeConfig = Field(description="The endpoint's config, handed to the application builder.")
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=1)
    target_ongoing_requests: int = Field(16, ge=1)
    head_size: PodSize
    worker_size: PodSize
    worker_models_volume: str = Field(
        WorkerSpec.model_fields["models_volume"].default,
        description="Size limit of each GPU worker's /models emptyDir (node disk), where its replica fetches the "
        "model: sized from the model's weights as the nightly workers' is (infra/k8s/model_disk.py).",
    )
    pool: str = Field(SERVE_POOL, description="The `llm-batch.io/pool` label of the endpoint's own GPU nodes.")
    internal_load_balancer: bool = False
    protect_from_consolidation: bool = False
    idle_timeout_s: int = Field(300, ge=0, description="An idle worker (no replica) is removed after this.")
    labels: dict[str, str] = Field(default_factory=dict)
    hub_token_secret_arn: str | None = None
    stack: str = Field(description="The Stack dimension of the endpoint's metrics.")
    metrics_namespace: str
    region: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_dns_label(value, "RayService name", MAX_NAME)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_labels(value, "labels")

    @field_validator("worker_models_volume")
    @classmethod
    def _worker_models_volume(cls, value: str) -> str:
        return check_quantity(value, "worker_models_volume")

    @field_validator("pool")
    @classmethod
    def _own_pool(cls, value: str) -> str:
        if value in (GPU_POOL, HEAD_POOL):
            raise ValueError(f"pool {value!r} is another workload's; the endpoint runs on nodes of its own")
        return check_dns_label(value, "pool")

    @model_validator(mode="after")
    def _consistent(self) -> RayServiceArgs:
        if self.serve.device != "gpu":
            raise ValueError("serve.device must be 'gpu' on the cluster: its workers are GPU nodes")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is more than max_replicas ({self.max_replicas})")
        if not self.serve.serve.api_key_secret:
            # The Service admits the whole VPC: the replicas check every request's key against this secret.
            raise ValueError("serve.serve.api_key_secret: the RayService's endpoint needs its API keys' secret")
        tp = self.serve.engine.tensor_parallel_size
        if self.worker_size.gpus < tp or self.worker_size.gpus % tp:
            raise ValueError(
                f"worker_size.gpus ({self.worker_size.gpus}) must be a multiple of tensor_parallel_size ({tp})"
            )
        return self

    @property
    def min_workers(self) -> int:
        return workers_for(self.min_replicas, self.worker_size.gpus, self.serve.engine.tensor_parallel_size)

    @property
    def max_workers(self) -> int:
        return workers_for(self.max_replicas, self.worker_size.gpus, self.serve.engine.tensor_parallel_size)

    @property
    def pod_labels(self) -> dict[str, str]:
        return pod_labels(self.name)


def pod_labels(name: str) -> dict[str, str]:
    """What tells a RayService's pods apart from the nightly RayJob's in the same namespace: its cluster label,
    which its NetworkPolicies select (infra/k8s/network_policy.py), and its own."""
    return {"llm-batch.io/rayservice": name, **cluster_labels(name)}


def workers_for(replicas: int, worker_gpus: int, tensor_parallel_size: int) -> int:
    """Worker pods (GPU nodes' worth) that `replicas` engine replicas of `tensor_parallel_size` GPUs fill."""
    return math.ceil(replicas / (worker_gpus // tensor_parallel_size))


def llm_deployment_name(model_id: str) -> str:
    return LLM_DEPLOYMENT_PREFIX + model_id.replace("/", "--").replace(".", "_")


def serve_config_v2(args: RayServiceArgs) -> dict[str, Any]:
    """Serve's config file: the application, its builder's args, and the engine deployment's autoscaling.

    The builder gets the endpoint's config with replicas >= 1 (ServeConfig's own floor); the override here is
    Serve's documented way to change a deployment's options from the config file, and takes it to `min_replicas`.
    """
    autoscaling = {
        "min_replicas": args.min_replicas,
        "initial_replicas": args.min_replicas,
        "max_replicas": args.max_replicas,
        "target_ongoing_requests": args.target_ongoing_requests,
    }
    return {
        # One proxy, on the head: the serve Service targets the head only, and workers come and go with replicas.
        "proxy_location": "HeadOnly",
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},  # the NetworkPolicy decides who reaches it
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": APP_IMPORT_PATH,
                "args": {"config": args.serve.model_dump(mode="json")},
                "deployments": [
                    {"name": llm_deployment_name(args.serve.serve.model_id), "autoscaling_config": autoscaling}
                ],
            }
        ],
    }


def _metadata(args: RayServiceArgs, component: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": {**base_labels(component), **args.pod_labels, **args.labels}}
    if args.protect_from_consolidation:
        metadata["annotations"] = {DO_NOT_DISRUPT: "true"}
    return metadata


def _env(args: RayServiceArgs) -> list[dict[str, str]]:
    # The region the replicas' Secrets Manager client reads the API keys from (the secret is the stack's).
    values = {**SERVE_ENV, "AWS_REGION": args.region}
    return [{"name": name, "value": value} for name, value in values.items()]


def _shm_mount() -> dict[str, Any]:
    return {"name": "dshm", "mountPath": "/dev/shm"}


def _models_mount() -> dict[str, Any]:
    return {"name": "models", "mountPath": MODELS_DIR}


def _with_hub_token(args: RayServiceArgs, pod: dict[str, Any]) -> dict[str, Any]:
    return hub_token.with_token(pod, args.image, args.hub_token_secret_arn, _container_security())


def _head_template(args: RayServiceArgs) -> dict[str, Any]:
    # No model volume and no hub token: the head builds the app from the model's label and runs no engine.
    return head_template(
        metadata=_metadata(args, "ray-head"),
        image=args.image,
        resources=args.head_size.resources(),
        container_security=_container_security(),
        env=_env(args),
        mounts=[_shm_mount()],
        volumes=[_shm_volume()],
        service_account=args.service_account,
        node_selector={POOL_LABEL: HEAD_POOL},
        extra_ports=[
            {"name": "serve", "containerPort": SERVE_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        sidecars=[_reporter(args)],
    )


def _reporter(args: RayServiceArgs) -> dict[str, Any]:
    """The sidecar publishing the endpoint's latency, errors and replicas (`python -m
    workload.telemetry.serve_reporter`)
    from the head's Prometheus export; the head's service account carries the job role's PutMetricData."""
    return {
        "name": "serve-reporter",
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "python",
            "-m",
            "workload.telemetry.serve_reporter",
            "--namespace",
            args.metrics_namespace,
            "--stack",
            args.stack,
            "--region",
            args.region,
            "--url",
            f"http://127.0.0.1:{METRICS_PORT}/metrics",
        ],
        "resources": {"requests": SERVE_REPORTER.as_dict(), "limits": SERVE_REPORTER.as_dict()},
        "securityContext": _container_security(),
    }


def _worker_template(args: RayServiceArgs) -> dict[str, Any]:
    container = {
        "name": "ray-worker",
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(args),
        "resources": args.worker_size.resources(),
        "securityContext": _container_security(),
        "volumeMounts": [_shm_mount(), _models_mount()],
    }
    return {
        "metadata": _metadata(args, WORKER_COMPONENT),
        "spec": _with_hub_token(
            args,
            {
                # The nightly workers' account: the job's S3/KMS role through IRSA, no Kubernetes token or rights.
                "serviceAccountName": args.worker_service_account,
                "automountServiceAccountToken": False,
                # The endpoint's own GPU nodes, never the nightly pool's: neither can take the other's GPUs.
                "nodeSelector": {POOL_LABEL: args.pool},
                "tolerations": [gpu_toleration()],
                "securityContext": _pod_security(),
                "containers": [container],
                # The replica fetches the model here (workload/serve/replica_model.py): the node's disk, sized.
                "volumes": [_shm_volume(), _models_volume(args.worker_models_volume)],
            },
        ),
    }


def _serve_service(args: RayServiceArgs) -> dict[str, Any]:
    """KubeRay's serve Service as an internal load balancer (KubeRay fills in the selector for the active cluster)."""
    return {
        "metadata": {
            "name": f"{args.name}-serve-svc",
            "labels": base_labels(SERVICE_COMPONENT),
            "annotations": dict(INTERNAL_LB_ANNOTATIONS),
        },
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"name": "serve", "port": SERVE_PORT, "targetPort": SERVE_PORT, "protocol": "TCP"}],
        },
    }


def render_rayservice(args: RayServiceArgs) -> Manifest:
    head_cpus = max(1, math.floor(quantity_value(args.head_size.cpu)))
    cluster: dict[str, Any] = {
        "rayVersion": args.ray_version,
        # Ray's token authentication on each cluster KubeRay brings up (an upgrade's new one gets its own token);
        # Serve's HTTP proxy takes no Ray token, so the endpoint's clients need none (infra/k8s/ray_auth.py).
        "authOptions": auth_options(),
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "upscalingMode": "Default",
            "idleTimeoutSeconds": args.idle_timeout_s,
            "resources": {"requests": RAY_AUTOSCALER.as_dict(), "limits": RAY_AUTOSCALER.as_dict()},
            "securityContext": _container_security(),
        },
        "headGroupSpec": {
            # Unlike the job's head, this one runs tasks: Serve's ingress replicas need a CPU, and on the head
            # they need no GPU node, so an idle endpoint (0 engine replicas) holds no GPU at all.
            "rayStartParams": {
                "dashboard-host": "0.0.0.0",
                "num-cpus": str(head_cpus),
                "metrics-export-port": str(METRICS_PORT),
            },
            "template": _head_template(args),
        },
        "workerGroupSpecs": [
            {
                "groupName": "gpu",
                "replicas": args.min_workers,
                "minReplicas": args.min_workers,
                "maxReplicas": args.max_workers,
                "rayStartParams": {},
                "template": _worker_template(args),
            }
        ],
    }
    spec: dict[str, Any] = {
        "serveConfigV2": yaml.safe_dump(serve_config_v2(args), sort_keys=False),
        "rayClusterConfig": cluster,
        # KubeRay's default, stated because the sizing depends on it: a changed cluster spec (a new image) brings
        # up a whole new cluster and switches traffic once it serves, so for a while there are two heads and the
        # new cluster's min workers (infra.config counts the head; infra.eks_serve.serve_worker_ceiling the nodes).
        "upgradeStrategy": {"type": "NewCluster"},
    }
    if args.internal_load_balancer:
        spec["serveService"] = _serve_service(args)
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayService",
        "metadata": {
            "name": args.name,
            "namespace": args.namespace,
            "labels": {**base_labels(SERVICE_COMPONENT), **args.labels},
        },
        "spec": spec,
    }
