"""The RayJob the nightly run submits, the RayCluster it brings up and the ConfigMap holding the job config.

The job runs on the Ray head: KubeRay's submitter runs `ray job submit` with the entrypoint below, the head
reads the job config from a mounted ConfigMap, and the GPU workers join the cluster and run the engines. When
the job ends, KubeRay deletes the cluster (`shutdownAfterJobFinishes`), so no GPU node stays behind.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.k8s import hub_token, model_disk
from infra.k8s.common import (
    DO_NOT_DISRUPT,
    GPU_POOL,
    GPU_RESOURCE,
    HEAD_POOL,
    POOL_LABEL,
    WORKER_COMPONENT,
    Manifest,
    base_labels,
    check_dns_label,
    check_labels,
    check_quantity,
    gpu_toleration,
    head_toleration,
    quantity_value,
)
from infra.k8s.head_group import RAY_AUTOSCALER, RAYJOB_SUBMITTER
from infra.k8s.network_policy import SUBMITTER_COMPONENT, cluster_labels
from infra.k8s.ray_auth import auth_options
from infra.k8s.ray_head import head_template
from workload.contract import entrypoint
from workload.contract.config import JobConfig, build_config, render_config
from workload.contract.entrypoint import MODELS_DIR

RAY_API_VERSION = "ray.io/v1"
CONFIG_DIR = "/etc/llm-batch"
CONFIG_FILE = "job.yaml"
ENTRYPOINT = f"python -m workload run --config {CONFIG_DIR}/{CONFIG_FILE}"
# The GPU worker's sidecar: publishes the node's GPU utilisation, which the driver on the CPU head cannot see.
GPU_REPORTER_COMMAND = ["python", "-m", "workload.telemetry.gpu_reporter", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"]
GPU_REPORTER_SIZE = {"cpu": "100m", "memory": "256Mi"}
# The image's user (the run spec, workload/contract/entrypoint.py); runAsNonRoot checks it is not 0.
JOB_UID = entrypoint.JOB_UID

# KubeRay names the RayCluster `<rayjob>-<5 chars>` and its head Service `<cluster>-head-svc`; a Service name
# is a 63-character DNS label, which leaves 47 for the RayJob (KubeRay's own validation limit).
MAX_RAYJOB_NAME = 47
# Seconds between SIGTERM and SIGKILL beyond the job's own grace period: time for Ray to stop after the job's
# shards are committed.
GRACE_MARGIN_S = 30
# Read by the Ray head's job supervisor: seconds between a stopped job's SIGTERM and its SIGKILL.
RAY_JOB_STOP_WAIT = "RAY_JOB_STOP_WAIT_TIME_S"
_RUN_ID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PodSize(_Strict):
    """Requests (equal to limits, so the pod is Guaranteed and Ray sees exactly what it may use)."""

    cpu: str = Field(description="CPU quantity, e.g. '2' or '3500m'.")
    memory: str = Field(description="Memory quantity, e.g. '8Gi'.")
    gpus: int = Field(0, ge=0, description="nvidia.com/gpu per pod.")

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, value: str, info: Any) -> str:
        return check_quantity(value, info.field_name)

    def resources(self) -> dict[str, dict[str, Any]]:
        amounts: dict[str, Any] = {"cpu": self.cpu, "memory": self.memory}
        if self.gpus:
            amounts[GPU_RESOURCE] = self.gpus
        return {"requests": dict(amounts), "limits": dict(amounts)}


class HeadSpec(_Strict):
    size: PodSize = Field(
        PodSize(cpu="2", memory="8Gi"),
        description="The head runs the driver and the GCS only (no Ray tasks: num-cpus 0); fits an m5.xlarge "
        "next to the operators.",
    )
    models_volume: str = Field(
        "20Gi",
        description="Size limit of the head's /models emptyDir (node disk). The driver fetches no model (each "
        "worker fetches its own, docs/model-and-nodes.md); this only keeps stray library caches off the "
        "container's writable layer.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=lambda: {POOL_LABEL: HEAD_POOL}, description="Where the head runs: on-demand nodes."
    )

    @field_validator("models_volume")
    @classmethod
    def _models_volume(cls, value: str) -> str:
        return check_quantity(value, "models_volume")


class WorkerSpec(_Strict):
    size: PodSize = Field(
        PodSize(cpu="6", memory="24Gi", gpus=1),
        description="One worker per GPU node: its gpus are all the node's (the stack config checks it, "
        "infra/config/eks.py), so the node's engines share the pod's one copy of the model; sized to fit a "
        "g5.2xlarge after the node's daemons.",
    )
    models_volume: str = Field(
        model_disk.models_volume(None),
        description="Size limit of each worker's /models emptyDir (node disk): the model's weights and vLLM's "
        "compile caches, from the model's size (infra/k8s/model_disk.py; the default fits the embedded tiny "
        "model); the stack config checks it fits the node's disk beside the image.",
    )
    min_replicas: int = Field(1, ge=0, description="Workers kept while the cluster lives.")
    max_replicas: int = Field(2, ge=1, description="Workers the job may use; the job's engines fill them all.")
    node_selector: dict[str, str] = Field(
        default_factory=lambda: {POOL_LABEL: GPU_POOL}, description="Where workers run: the Spot GPU pool."
    )
    group_name: str = Field(
        GPU_POOL,
        description="The KubeRay worker group's name: the pool its workers run on (the large tier's `gpu` or `gpu8`).",
    )

    @field_validator("models_volume")
    @classmethod
    def _models_volume(cls, value: str) -> str:
        return check_quantity(value, "models_volume")

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSpec:
        if self.size.gpus < 1:
            raise ValueError("workers.size.gpus must be at least 1: the workers run the GPU engines")
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"workers.min_replicas ({self.min_replicas}) is more than workers.max_replicas ({self.max_replicas})"
            )
        return self


class RayJobArgs(_Strict):
    """Everything one RayJob is rendered from; the nightly submitter changes only name, input and output."""

    name: str = Field(description="RayJob name; the ConfigMap is `<name>-config`.")
    namespace: str
    image: str = Field(description="The job image, pinned by tag or digest (never 'latest').")
    service_account: str = Field(description="The head's service account: the job's S3 and KMS access (IRSA).")
    worker_service_account: str = Field(
        description="The GPU workers' service account: the same IRSA access, no Kubernetes rights or API token."
    )
    ray_version: str = Field(description="Ray version inside the image; KubeRay uses it to configure the cluster.")
    job: JobConfig = Field(description="The job config; mounted into the head as YAML.")
    head: HeadSpec = HeadSpec()
    workers: WorkerSpec = WorkerSpec()
    autoscaling: bool = Field(
        False, description="Ray's autoscaler adds workers from min to max as the job asks for GPUs."
    )
    idle_timeout_s: int = Field(60, ge=0, description="An idle worker is removed after this (autoscaling only).")
    active_deadline_s: int = Field(
        6 * 3600,
        ge=60,
        description="The whole run (cluster start included) is failed after this many seconds.",
    )
    backoff_limit: int = Field(
        2,
        ge=0,
        le=10,
        description="Retries, each on a fresh cluster; the job resumes what the last one left.",
    )
    ttl_after_finished_s: int = Field(
        60,
        ge=0,
        le=3600,
        description="Seconds the finished cluster is kept (for logs) before KubeRay deletes it.",
    )
    protect_from_consolidation: bool = Field(
        False, description="Annotate Ray pods so Karpenter never consolidates a node out from under a run."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every object (run id).")
    hub_token_secret_arn: str | None = Field(
        None, description="Secrets Manager ARN of the Hugging Face token; None: public models only."
    )
    cluster: str | None = Field(
        None,
        description="The Ray cluster's `llm-batch.io/ray-cluster` label on every pod and the submitter, which its "
        "NetworkPolicies select (infra/k8s/network_policy.py); None: the RayJob's name. A night keeps its base's.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_dns_label(value, "RayJob name", MAX_RAYJOB_NAME)

    @field_validator("namespace", "service_account", "worker_service_account")
    @classmethod
    def _label(cls, value: str, info: Any) -> str:
        return check_dns_label(value, info.field_name)

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, value: str) -> str:
        if not value or any(char.isspace() for char in value):
            raise ValueError(f"image {value!r} is empty or contains whitespace")
        if "@sha256:" in value:
            return value
        last = value.rsplit("/", 1)[-1]
        if ":" not in last:
            raise ValueError(f"image {value!r} has no tag or digest: pin it")
        if last.endswith(":latest"):
            raise ValueError(f"image {value!r} uses 'latest': pin a version or digest")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_labels(value, "labels")

    @model_validator(mode="after")
    def _job_fits_cluster(self) -> RayJobArgs:
        job, workers = self.job, self.workers
        if job.device != "gpu":
            raise ValueError("job.device must be 'gpu' on a Ray cluster: its workers are GPU nodes")
        tp = job.engine.tensor_parallel_size
        if tp > workers.size.gpus:
            raise ValueError(
                f"job.engine.tensor_parallel_size ({tp}) is more than the GPUs of one worker "
                f"({workers.size.gpus}); an engine must fit on one worker"
            )
        engines = engines_for(workers, tp)
        # Ray Data LLM reserves a placement group of tp bundles {GPU: 1, CPU: 1} for a tensor-parallel engine,
        # beside its engine actor's own CPU (ray/llm/_internal/batch/stages/vllm_engine_stage.py, 2.60): a pod
        # whose CPUs cannot hold them never schedules its engines, and the night waits for ever.
        per_pod = workers.size.gpus // tp
        cpus = (tp + 1) * per_pod if tp > 1 else per_pod
        if quantity_value(workers.size.cpu) < cpus:
            raise ValueError(
                f"workers.size.cpu ({workers.size.cpu}) cannot hold {per_pod} engine(s) at tensor_parallel_size "
                f"{tp}: each takes {tp} placement bundles of 1 CPU and 1 GPU plus its own CPU; give the workers at "
                f"least {cpus} CPUs"
            )
        if job.replicas != engines:
            raise ValueError(
                f"job.replicas ({job.replicas}) must be {engines}: {workers.max_replicas} workers x "
                f"{workers.size.gpus} GPUs / tensor_parallel_size {tp}, so every GPU the cluster can get is "
                "used and no engine waits for one it can never get"
            )
        if not self.autoscaling and workers.min_replicas != workers.max_replicas:
            raise ValueError("workers.min_replicas must equal workers.max_replicas when autoscaling is off")
        return self

    @property
    def ray_cluster(self) -> str:
        return self.cluster or self.name

    @property
    def config_map_name(self) -> str:
        return f"{self.name}-config"

    @property
    def termination_grace_s(self) -> int:
        return termination_grace_s(self.job.resume.grace_period_s)


def termination_grace_s(grace_period_s: float) -> int:
    """The Ray pods' SIGTERM-to-SIGKILL wait: above the job's own grace period, so it can commit its finished shards
    and write its partial files before SIGKILL."""
    return math.ceil(grace_period_s) + GRACE_MARGIN_S


def engines_for(workers: WorkerSpec, tensor_parallel_size: int) -> int:
    """Engine replicas that use every GPU the workers can have."""
    if workers.size.gpus % tensor_parallel_size:
        raise ValueError(
            f"workers.size.gpus ({workers.size.gpus}) is not a multiple of tensor_parallel_size "
            f"({tensor_parallel_size})"
        )
    return workers.max_replicas * workers.size.gpus // tensor_parallel_size


def fit_job_to_workers(job: JobConfig, workers: WorkerSpec) -> JobConfig:
    """The job config for this cluster: engines on GPUs, one replica per engine the workers hold."""
    replicas = engines_for(workers, job.engine.tensor_parallel_size)
    return build_config(job.model_dump(mode="json"), {"device": "gpu", "replicas": replicas})


def for_night(base: RayJobArgs, *, run_id: str, input_uri: str, output_uri: str) -> RayJobArgs:
    """One night's run: its own RayJob name, input, output and metrics run id; all else as in `base`."""
    run = run_id.lower()
    room = MAX_RAYJOB_NAME - len(base.name) - 1
    if not _RUN_ID.match(run) or len(run) > room:
        raise ValueError(
            f"run_id {run_id!r} must be at most {room} letters, digits and '-' (it becomes part of the "
            f"RayJob name {base.name}-<run_id>), e.g. '20261129t0200'"
        )
    overrides = {"input.uri": input_uri, "output.uri": output_uri, "metrics.run_id": run_id}
    job = build_config(base.job.model_dump(mode="json"), overrides)
    data = base.model_dump()
    data.update(
        name=f"{base.name}-{run}",
        cluster=base.ray_cluster,
        job=job,
        labels={**base.labels, "llm-batch.io/run-id": run},
    )
    return RayJobArgs.model_validate(data)


def _pod_metadata(args: RayJobArgs, component: str) -> dict[str, Any]:
    labels = {**base_labels(component), **cluster_labels(args.ray_cluster), **args.labels}
    metadata: dict[str, Any] = {"labels": labels}
    if args.protect_from_consolidation:
        metadata["annotations"] = {DO_NOT_DISRUPT: "true"}
    return metadata


def _container_security() -> dict[str, Any]:
    # The containers whose command KubeRay or a script owns (submitter, autoscaler, token fetch, GPU reporter):
    # no privileges. The Ray containers, which run the job, take the run spec's whole context (read-only root).
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict[str, Any]:
    # Every container of a Ray pod (Ray, sidecar, init, KubeRay's autoscaler) runs as the image's user, never root.
    return entrypoint.pod_security_context()


SCRATCH_VOLUME = "scratch"


def _shm_volume() -> dict[str, Any]:
    # Ray's object store and vLLM's workers use /dev/shm; the container default (64 MiB) is far too small.
    return {"name": "dshm", "emptyDir": {"medium": "Memory"}}


def _models_volume(size: str) -> dict[str, Any]:
    # On the node's disk (no medium), so weights neither fill the container's writable layer nor count against
    # the pod's memory; sizeLimit has the kubelet evict a pod that outgrows it rather than fill the node.
    return {"name": "models", "emptyDir": {"sizeLimit": size}}


def _config_volume(args: RayJobArgs) -> dict[str, Any]:
    return {
        "name": "job-config",
        "configMap": {"name": args.config_map_name, "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}]},
    }


def _ray_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "job-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "models", "mountPath": MODELS_DIR},
        {"name": SCRATCH_VOLUME, "mountPath": entrypoint.SCRATCH_DIR},
    ]


def _gpu_reporter(args: RayJobArgs) -> dict[str, Any]:
    """The sidecar publishing the worker node's GPU utilisation (`python -m workload.telemetry.gpu_reporter`).

    It asks for no GPU: the device plugin hands each `nvidia.com/gpu` to one container only, so a request here
    would take the GPU away from the engine (or leave the pod unschedulable). Instead it sets
    `NVIDIA_VISIBLE_DEVICES=all`, which the NVIDIA container runtime (containerd's default runtime on the EKS
    AL2023 NVIDIA AMI that both the managed group and Karpenter's nodes run) reads to mount the node's GPU
    devices and the driver's NVML library, as GPU monitoring agents do. The reporter only reads utilisation
    through NVML and allocates nothing on the GPU, so the engine keeps all of its memory.

    A separate container rather than a background process in the Ray container: KubeRay owns that
    container's command (`ray start ... --block`), and a sidecar keeps its own small resources and logs.
    Were the toolkit set to ignore the variable for unprivileged containers
    (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`), the reporter would find no GPU, say
    so in its log and exit 0: the run is unaffected, only GPUUtilization is missing.
    """
    amounts = dict(GPU_REPORTER_SIZE)
    return {
        "name": "gpu-reporter",
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(GPU_REPORTER_COMMAND),
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        # Requests equal limits: the worker pod stays Guaranteed.
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "job-config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }


def _with_hub_token(args: RayJobArgs, pod: dict[str, Any]) -> dict[str, Any]:
    return hub_token.with_token(pod, args.image, args.hub_token_secret_arn, _container_security())


def _head_template(args: RayJobArgs) -> dict[str, Any]:
    template = head_template(
        metadata=_pod_metadata(args, "ray-head"),
        image=args.image,
        resources=args.head.size.resources(),
        container_security=entrypoint.container_security_context(),
        # Ray's job stop (KubeRay's, when the RayJob is deleted) sends the driver SIGTERM and SIGKILLs it after
        # RAY_JOB_STOP_WAIT_TIME_S, 3 s by default (ray/dashboard/modules/job/job_supervisor.py, Ray 2.60, read
        # 2026-12-06): far too soon to commit finished shards and write the partial files. The head's job
        # supervisor waits the pods' grace instead, so a cancel's stop gives the job its whole grace period (issue
        # 59, finding 6).
        env=[*entrypoint.k8s_env(), {"name": RAY_JOB_STOP_WAIT, "value": str(args.termination_grace_s)}],
        mounts=_ray_mounts(),
        volumes=[
            _config_volume(args),
            _shm_volume(),
            _models_volume(args.head.models_volume),
            entrypoint.k8s_scratch_volume(SCRATCH_VOLUME),
        ],
        service_account=args.service_account,
        node_selector=args.head.node_selector,
        pod_options={
            # A Kubernetes API token only for KubeRay's autoscaler sidecar (it scales the worker group through
            # the API as this account); Ray itself never calls the API, and the IRSA token is a separate
            # projected volume.
            "automountServiceAccountToken": args.autoscaling,
            "terminationGracePeriodSeconds": args.termination_grace_s,
        },
    )
    template["spec"] = _with_hub_token(args, template["spec"])
    return template


def _worker_template(args: RayJobArgs) -> dict[str, Any]:
    container = {
        "name": "ray-worker",
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",
        "resources": args.workers.size.resources(),
        "securityContext": entrypoint.container_security_context(),
        "env": entrypoint.k8s_env(),
        "volumeMounts": _ray_mounts(),
    }
    return {
        "metadata": _pod_metadata(args, WORKER_COMPONENT),
        "spec": _with_hub_token(
            args,
            {
                # Workers read input and write output shards themselves: they need the job's S3/KMS identity,
                # but not the head's service account, which KubeRay binds to the autoscaler's Role. Their own
                # account has no Kubernetes rights, and no API token is mounted: the IRSA token is a separate
                # projected volume the EKS pod identity webhook adds whatever automountServiceAccountToken says.
                "serviceAccountName": args.worker_service_account,
                "automountServiceAccountToken": False,
                "nodeSelector": dict(args.workers.node_selector),
                "tolerations": [gpu_toleration()],
                "terminationGracePeriodSeconds": args.termination_grace_s,
                "securityContext": _pod_security(),
                # KubeRay treats the first container as Ray's; the reporter comes after it.
                "containers": [container, _gpu_reporter(args)],
                "volumes": [
                    _config_volume(args),
                    _shm_volume(),
                    _models_volume(args.workers.models_volume),
                    entrypoint.k8s_scratch_volume(SCRATCH_VOLUME),
                ],
            },
        ),
    }


def render_ray_cluster_spec(args: RayJobArgs) -> Manifest:
    """The RayCluster spec the RayJob brings up: head on on-demand nodes, GPU workers on Spot."""
    workers = args.workers
    replicas = workers.min_replicas if args.autoscaling else workers.max_replicas
    spec: Manifest = {
        "rayVersion": args.ray_version,
        # Ray's token authentication; KubeRay makes the token and hands it to every Ray process, the autoscaler
        # and the submitter (infra/k8s/ray_auth.py).
        "authOptions": auth_options(),
        "enableInTreeAutoscaling": args.autoscaling,
        "headGroupSpec": {
            # num-cpus 0: no Ray task lands on the head, so losing a worker never stalls the driver.
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
            "template": _head_template(args),
        },
        "workerGroupSpecs": [
            {
                "groupName": workers.group_name,
                "replicas": replicas,
                "minReplicas": workers.min_replicas,
                "maxReplicas": workers.max_replicas,
                "rayStartParams": {},
                "template": _worker_template(args),
            }
        ],
    }
    if args.autoscaling:
        spec["autoscalerOptions"] = {
            "upscalingMode": "Default",
            "idleTimeoutSeconds": args.idle_timeout_s,
            "resources": {"requests": RAY_AUTOSCALER.as_dict(), "limits": RAY_AUTOSCALER.as_dict()},
            "securityContext": _container_security(),
        }
    return spec


def _submitter_template(args: RayJobArgs) -> dict[str, Any]:
    """The pod that runs `ray job submit` (KubeRay fills in the command and the head's address).

    KubeRay's default asks for 500m CPU, which with everything else on the head group leaves the large tier's
    head node short (infra/k8s/head_group.py); this one asks for what following a job's logs needs, on the
    head nodes, as the image's user, with no Kubernetes API token (it talks to the Ray dashboard only).
    """
    return {
        # The cluster's label: its head's policy admits this pod (and no other) on the job API.
        "metadata": {"labels": {**base_labels(SUBMITTER_COMPONENT), **cluster_labels(args.ray_cluster), **args.labels}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "nodeSelector": dict(args.head.node_selector),
            "tolerations": [head_toleration()],
            "securityContext": _pod_security(),
            "containers": [
                {
                    "name": "ray-job-submitter",
                    # The head's image, as KubeRay's default does: the `ray` CLI matches the cluster's Ray.
                    "image": args.image,
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {"requests": RAYJOB_SUBMITTER.as_dict(), "limits": RAYJOB_SUBMITTER.as_dict()},
                    "securityContext": _container_security(),
                }
            ],
        },
    }


def render_config_map(args: RayJobArgs) -> Manifest:
    """The job config as the file the entrypoint reads (`render_config`, read back by `load_config`)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": args.config_map_name,
            "namespace": args.namespace,
            "labels": {**base_labels("job-config"), **args.labels},
        },
        "data": {CONFIG_FILE: render_config(args.job)},
    }


def render_rayjob(args: RayJobArgs) -> Manifest:
    """The RayJob: runs the job on a fresh cluster, retries on a new one, and deletes the cluster after."""
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": args.name,
            "namespace": args.namespace,
            "labels": {**base_labels("ray-job"), **args.labels},
        },
        "spec": {
            "entrypoint": ENTRYPOINT,
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": args.ttl_after_finished_s,
            "backoffLimit": args.backoff_limit,
            "activeDeadlineSeconds": args.active_deadline_s,
            "submitterPodTemplate": _submitter_template(args),
            "rayClusterSpec": render_ray_cluster_spec(args),
        },
    }


def render_job(args: RayJobArgs) -> list[Manifest]:
    """The objects one run needs, in creation order (the ConfigMap before the pods that mount it)."""
    return [render_config_map(args), render_rayjob(args)]
