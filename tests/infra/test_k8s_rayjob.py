"""The RayJob renderer: objects checked against KubeRay's real CRDs, and the rules the schema can't see."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra.eks_job import base_rayjob_args
from infra.k8s.common import DO_NOT_DISRUPT, GPU_RESOURCE, GPU_TAINT_KEY, POOL_LABEL, quantity_value
from infra.k8s.rayjob import (
    ENTRYPOINT,
    HeadSpec,
    RayJobArgs,
    WorkerSpec,
    fit_job_to_workers,
    for_night,
    render_config_map,
    render_job,
    render_ray_cluster_spec,
    render_rayjob,
)
from infra.ops.stacks import offline_config
from infra.rules.checks_k8s import pod_security_problems, pod_specs
from tests.infra.crd_schema import assert_valid, crd_errors
from tests.infra.k8s_fixtures import IMAGE, job_config, large_args, medium_args
from workload.contract.config import build_config, load_config
from workload.contract.entrypoint import MODEL_CACHE_DIR, MODELS_DIR
from workload.telemetry import gpu_reporter

TIERS = {"medium": medium_args, "large": large_args}


def _night(args: RayJobArgs) -> RayJobArgs:
    return for_night(
        args,
        run_id="20261129t0200",
        input_uri="s3://bucket/in/2026-11-29/",
        output_uri="s3://bucket/out/2026-11-29/",
    )


def _head(rayjob: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    return spec


def _worker_group(rayjob: dict[str, Any]) -> dict[str, Any]:
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return dict(group)


@pytest.mark.parametrize("tier", sorted(TIERS))
@pytest.mark.parametrize("nightly", [False, True], ids=["base", "nightly"])
def test_rayjob_and_its_cluster_match_the_kuberay_crds(crds_dir: Path, tier: str, nightly: bool) -> None:
    args = TIERS[tier]()
    if nightly:
        args = _night(args)
    assert_valid(render_rayjob(args), crds_dir)
    # The same cluster spec as a standalone RayCluster, against the RayCluster CRD.
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": args.name, "namespace": args.namespace},
        "spec": render_ray_cluster_spec(args),
    }
    assert_valid(cluster, crds_dir)


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_every_pod_of_the_rayjob_passes_restricted_pod_security(tier: str) -> None:
    """Head, GPU workers, submitter and the autoscaler sidecar: the job namespace enforces `restricted`, so a pod
    spec below it would be refused by the API server on the night."""
    rayjob = render_rayjob(_night(TIERS[tier]()))
    pods = dict(pod_specs(rayjob))
    assert set(pods) == {
        "spec.submitterPodTemplate.spec",
        "spec.rayClusterSpec.headGroupSpec.template.spec",
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec",
    }
    assert {where: pod_security_problems(pod) for where, pod in pods.items()} == {where: [] for where in pods}


def test_pod_security_check_names_each_gap() -> None:
    rayjob = render_rayjob(large_args())
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head["securityContext"].pop("runAsNonRoot")
    head["volumes"].append({"name": "host", "hostPath": {"path": "/var/run"}})
    rayjob["spec"]["rayClusterSpec"]["autoscalerOptions"]["securityContext"] = {}
    problems = dict(pod_specs(rayjob))["spec.rayClusterSpec.headGroupSpec.template.spec"]
    found = pod_security_problems(problems)
    assert "hostPath volume host" in found
    assert "container ray-head may run as root (runAsNonRoot is not true)" in found
    assert "container autoscaler does not drop ALL capabilities" in found


def test_strict_check_catches_a_misspelt_field(crds_dir: Path) -> None:
    """The validator has teeth: a field Kubernetes would silently prune is an error here."""
    rayjob = render_rayjob(medium_args())
    rayjob["spec"]["shutdownAfterJobFinish"] = True
    _head(rayjob)["containers"][0]["resource"] = {}
    rayjob["spec"]["backoffLimit"] = "2"
    errors = "\n".join(crd_errors(rayjob, crds_dir))
    assert "shutdownAfterJobFinish" in errors
    assert "'resource' was unexpected" in errors
    assert "spec.backoffLimit" in errors


def test_run_lifecycle_leaves_nothing_running() -> None:
    args = medium_args()
    spec = render_rayjob(args)["spec"]
    assert spec["entrypoint"] == ENTRYPOINT == "python -m workload run --config /etc/llm-batch/job.yaml"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == args.ttl_after_finished_s == 60
    assert spec["backoffLimit"] == 2
    assert spec["activeDeadlineSeconds"] == 6 * 3600
    assert spec["submissionMode"] == "K8sJobMode"


def test_head_runs_on_demand_with_the_job_config_mounted() -> None:
    args = medium_args()
    config_map, rayjob = render_job(args)
    head = _head(rayjob)
    assert head["nodeSelector"] == {POOL_LABEL: "head"}
    # The head pool is tainted so nothing else keeps its node up: the Ray head (and the submitter) tolerate it.
    assert head["tolerations"] == [{"key": POOL_LABEL, "operator": "Equal", "value": "head", "effect": "NoSchedule"}]
    submitter = rayjob["spec"]["submitterPodTemplate"]["spec"]
    assert submitter["nodeSelector"] == {POOL_LABEL: "head"} and submitter["tolerations"] == head["tolerations"]
    (container,) = head["containers"]
    assert container["image"] == IMAGE
    mount = next(m for m in container["volumeMounts"] if m["name"] == "job-config")
    volume = next(v for v in head["volumes"] if v["name"] == "job-config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] == "llm-batch-config"
    path = f"{mount['mountPath']}/{volume['configMap']['items'][0]['path']}"
    assert ENTRYPOINT.endswith(f"--config {path}")
    assert mount["readOnly"] is True
    assert rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert GPU_RESOURCE not in container["resources"]["limits"]


def test_workers_take_spot_gpus_and_tolerate_their_taint() -> None:
    rayjob = render_rayjob(medium_args())
    group = _worker_group(rayjob)
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {POOL_LABEL: "gpu"}
    assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    container = pod["containers"][0]
    assert container["name"] == "ray-worker"
    assert container["resources"]["limits"][GPU_RESOURCE] == 1
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert _head(rayjob)["serviceAccountName"] == "llm-batch-job"
    # Their own account (KubeRay binds the head's to the autoscaler's Role) and no Kubernetes API token.
    assert pod["serviceAccountName"] == "llm-batch-worker" and pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_medium_is_a_fixed_cluster_of_the_configured_size() -> None:
    spec = render_rayjob(medium_args())["spec"]["rayClusterSpec"]
    group = _worker_group({"spec": {"rayClusterSpec": spec}})
    assert spec["enableInTreeAutoscaling"] is False
    assert "autoscalerOptions" not in spec
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    # No autoscaler sidecar, so nothing on the head needs a Kubernetes API token (checkov CKV_K8S_38).
    assert spec["headGroupSpec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_large_autoscales_one_to_eight_and_is_shielded_from_consolidation() -> None:
    rayjob = render_rayjob(large_args())
    spec = rayjob["spec"]["rayClusterSpec"]
    group = _worker_group(rayjob)
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 60
    # KubeRay's autoscaler sidecar scales the worker group through the API as the head's account.
    assert spec["headGroupSpec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 1, 8)
    for template in (spec["headGroupSpec"]["template"], group["template"]):
        assert template["metadata"]["annotations"] == {DO_NOT_DISRUPT: "true"}
        assert template["metadata"]["labels"]["llm-batch.io/stack"] == "large"


def test_job_config_asks_for_every_gpu_the_workers_have() -> None:
    for make, engines in ((medium_args, 2), (large_args, 8)):
        job = make().job
        assert job.device == "gpu"
        assert job.replicas == engines


def test_grace_period_outlasts_the_jobs_own() -> None:
    args = medium_args()
    rayjob = render_rayjob(args)
    for pod in (_head(rayjob), _worker_group(rayjob)["template"]["spec"]):
        assert pod["terminationGracePeriodSeconds"] > args.job.resume.grace_period_s
    assert args.termination_grace_s == 120


def test_rays_job_stop_waits_the_pods_grace_before_sigkill() -> None:
    """KubeRay stops the Ray job when its RayJob is deleted (a cancel's stop on EKS, through the sweep or the next
    submit): Ray's job supervisor sends SIGTERM and SIGKILLs after RAY_JOB_STOP_WAIT_TIME_S, 3 s unless the head
    says otherwise, too soon to commit and write the partial files. The head says the pods' grace, which outlasts
    the job's own (issue 59, finding 6)."""
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor

    assert JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S == 3  # the default this setting replaces (Ray 2.60)
    for make in (medium_args, large_args):
        args = make()
        head = _head(render_rayjob(args))
        (env,) = [item for item in head["containers"][0]["env"] if item["name"] == "RAY_JOB_STOP_WAIT_TIME_S"]
        assert int(env["value"]) == head["terminationGracePeriodSeconds"] == args.termination_grace_s
        assert int(env["value"]) > args.job.resume.grace_period_s


def test_config_map_reads_back_to_the_same_job_config(tmp_path: Path) -> None:
    args = _night(large_args())
    config_map = render_config_map(args)
    ((name, text),) = config_map["data"].items()
    (tmp_path / name).write_text(text)
    assert load_config(tmp_path / name) == args.job


def test_nightly_run_changes_only_names_input_and_output() -> None:
    base = medium_args()
    night = _night(base)
    assert night.name == "llm-batch-20261129t0200"
    assert night.job.input.uri == "s3://bucket/in/2026-11-29/"
    assert night.job.output.uri == "s3://bucket/out/2026-11-29/"
    assert night.job.metrics.run_id == "20261129t0200"
    assert night.labels["llm-batch.io/run-id"] == "20261129t0200"
    assert night.job.engine == base.job.engine and night.job.replicas == base.job.replicas
    assert night.workers == base.workers and night.image == base.image
    config_map, rayjob = render_job(night)
    assert rayjob["metadata"]["name"] == "llm-batch-20261129t0200"
    assert _head(rayjob)["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]


def test_args_round_trip_through_json() -> None:
    """The nightly submitter may receive the base args as JSON (a stack output) and rebuild them exactly."""
    args = large_args()
    assert RayJobArgs.model_validate_json(args.model_dump_json()) == args


def _with(args: RayJobArgs, **changes: Any) -> RayJobArgs:
    data = args.model_dump()
    data.update(changes)
    return RayJobArgs.model_validate(data)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "llm-batch-" + "x" * 40}, "RayJob name"),
        ({"name": "LLM_batch"}, "RayJob name"),
        ({"namespace": "Bad Namespace"}, "namespace"),
        ({"image": "llm-batch"}, "no tag or digest"),
        ({"image": "repo/llm-batch:latest"}, "uses 'latest'"),
        ({"labels": {"bad key!": "x"}}, "not a valid Kubernetes label key"),
        ({"backoff_limit": -1}, "backoff_limit"),
        ({"active_deadline_s": 10}, "active_deadline_s"),
    ],
)
def test_bad_args_are_refused_with_the_field_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _with(medium_args(), **changes)


def test_a_cpu_job_or_a_wrong_engine_count_is_refused() -> None:
    args = medium_args()
    with pytest.raises(ValidationError, match=r"job.device must be 'gpu'"):
        _with(args, job=job_config())
    three = args.job.model_copy(update={"replicas": 3})
    with pytest.raises(ValidationError, match=r"job.replicas \(3\) must be 2"):
        _with(args, job=three)
    wide = fit_job_to_workers(job_config(), args.workers).model_copy(
        update={"engine": args.job.engine.model_copy(update={"tensor_parallel_size": 2})}
    )
    with pytest.raises(ValidationError, match=r"tensor_parallel_size .2. is more than the GPUs of one worker"):
        _with(args, job=wide)


def test_worker_bounds_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"min_replicas .3. is more than workers.max_replicas .2."):
        WorkerSpec(min_replicas=3, max_replicas=2)
    with pytest.raises(ValidationError, match="gpus must be at least 1"):
        WorkerSpec.model_validate({"size": {"cpu": "4", "memory": "8Gi", "gpus": 0}})
    with pytest.raises(ValidationError, match="not a Kubernetes quantity"):
        WorkerSpec.model_validate({"size": {"cpu": "four", "memory": "8Gi", "gpus": 1}})
    workers = WorkerSpec(min_replicas=1, max_replicas=2)
    args = medium_args()
    with pytest.raises(ValidationError, match=r"must equal workers.max_replicas when autoscaling is off"):
        _with(args, workers=workers.model_dump(), job=fit_job_to_workers(job_config(), workers))


@pytest.mark.parametrize("run_id", ["2026-11-29T02:00:00Z", "", "x" * 40, "-night"])
def test_a_bad_run_id_is_refused(run_id: str) -> None:
    with pytest.raises(ValueError, match="run_id"):
        for_night(medium_args(), run_id=run_id, input_uri="s3://b/i", output_uri="s3://b/o")


def test_a_blank_night_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"input\.uri"):
        for_night(medium_args(), run_id="20261129", input_uri=" ", output_uri="s3://b/o")


def _pods(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    return [_head(rayjob), _worker_group(rayjob)["template"]["spec"]]


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_gpu_workers_run_the_gpu_reporter_beside_ray(tier: str) -> None:
    rayjob = render_rayjob(TIERS[tier]())
    worker = _worker_group(rayjob)["template"]["spec"]
    ray, reporter = worker["containers"]
    assert ray["name"] == "ray-worker"  # KubeRay configures the first container as Ray's
    assert reporter["name"] == "gpu-reporter"
    assert reporter["image"] == ray["image"] == IMAGE
    assert reporter["command"][:3] == ["python", "-m", "workload.telemetry.gpu_reporter"]
    # It reads the config the ConfigMap mounts, at the path the mount gives it.
    config_path = reporter["command"][reporter["command"].index("--config") + 1]
    mount = next(m for m in reporter["volumeMounts"] if m["name"] == "job-config")
    assert config_path.startswith(mount["mountPath"] + "/") and mount["readOnly"] is True
    assert "job-config" in {v["name"] for v in worker["volumes"]}
    # No GPU request (that would take the engine's GPU); the runtime exposes the node's GPUs through the env.
    assert GPU_RESOURCE not in reporter["resources"]["requests"]
    assert GPU_RESOURCE not in reporter["resources"]["limits"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in reporter["env"]
    # Small, and requests equal limits so the worker pod stays Guaranteed.
    assert reporter["resources"]["requests"] == reporter["resources"]["limits"]
    assert quantity_value(reporter["resources"]["limits"]["cpu"]) <= 0.25
    assert quantity_value(reporter["resources"]["limits"]["memory"]) <= 512 * 2**20
    # The head has no GPU and runs no reporter.
    assert [c["name"] for c in _head(rayjob)["containers"]] == ["ray-head"]


def test_the_sidecars_command_runs_the_reporter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sidecar's argv, against the ConfigMap's own file, reaches the reporter's GPU check (none here)."""
    args = medium_args()
    job = build_config(args.job.model_dump(mode="json"), {"metrics.sink": "cloudwatch"})
    config_map = render_config_map(args.model_copy(update={"job": job}))
    ((name, text),) = config_map["data"].items()
    (tmp_path / name).write_text(text)
    command = _worker_group(render_rayjob(args))["template"]["spec"]["containers"][1]["command"]
    module_args = command[3:]
    module_args[module_args.index("--config") + 1] = str(tmp_path / name)
    if gpu_reporter.GpuSampler.open() is not None:
        pytest.skip("this machine has a GPU: the reporter would publish for real")
    assert gpu_reporter.main(module_args) == 0
    assert "no NVIDIA GPU on this node" in capsys.readouterr().err


def _dockerfile_user() -> tuple[int, int]:
    text = (Path(__file__).resolve().parents[2] / "workload" / "Dockerfile").read_text()
    uid = re.search(r"useradd --uid (\d+) --user-group", text)
    user = re.search(r"^USER (\d+):(\d+)$", text, re.MULTILINE)
    assert uid and user, "workload/Dockerfile no longer creates and switches to a numeric user"
    assert int(uid.group(1)) == int(user.group(1))
    return int(user.group(1)), int(user.group(2))


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_ray_pods_run_as_the_images_non_root_user(tier: str) -> None:
    args = TIERS[tier]().model_copy(update={"hub_token_secret_arn": "arn:aws:secretsmanager:us-east-1:1:secret:t"})
    uid, gid = _dockerfile_user()
    rayjob = render_rayjob(args)
    for pod in _pods(rayjob):
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid) != (0, 0)
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, container["name"]
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], container["name"]
            assert "privileged" not in container["securityContext"]
    options = rayjob["spec"]["rayClusterSpec"].get("autoscalerOptions")
    if options is not None:
        assert options["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_models_live_on_a_sized_node_disk_volume(tier: str) -> None:
    args = TIERS[tier]()
    rayjob = render_rayjob(args)
    sizes = {"ray-head": args.head.models_volume, "ray-worker": args.workers.models_volume}
    for pod in _pods(rayjob):
        ray = pod["containers"][0]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
        assert "medium" not in volume["emptyDir"]  # node disk, not memory
        assert volume["emptyDir"]["sizeLimit"] == sizes[ray["name"]]
        mount = next(m for m in ray["volumeMounts"] if m["name"] == "models")
        assert mount["mountPath"] == MODELS_DIR
        assert not mount.get("readOnly", False)
    # What the tiers render into the job config caches under that mount.
    assert MODEL_CACHE_DIR.startswith(MODELS_DIR + "/")


@pytest.mark.parametrize("stack", ["medium", "large"])
def test_models_volume_fits_the_stacks_node_disk(stack: str) -> None:
    config = offline_config(stack)
    args = base_rayjob_args(config, stack, IMAGE, "bucket")
    assert args.job.model.cache_dir.startswith(MODELS_DIR + "/")
    node_disk = config.eks.node_volume_gib * 2**30
    # Room for the image (about 15 GB of CUDA wheels) and the node's own use beside the cache.
    assert quantity_value(args.workers.models_volume) <= node_disk - 40 * 2**30
    assert quantity_value(args.head.models_volume) <= node_disk - 40 * 2**30


def test_a_bad_models_volume_is_refused() -> None:
    with pytest.raises(ValidationError, match="models_volume"):
        WorkerSpec(models_volume="lots")
    with pytest.raises(ValidationError, match="models_volume"):
        HeadSpec(models_volume="")


@pytest.mark.parametrize(
    ("instance_type", "tp", "cpu", "engines"),
    [("p4d.24xlarge", 4, "10", 2), ("p4d.24xlarge", 8, "9", 1), ("g5.12xlarge", 2, "6", 2), ("g5.12xlarge", 1, "4", 4)],
)
def test_tensor_parallel_workers_hold_their_bundles(instance_type: str, tp: int, cpu: str, engines: int) -> None:
    """A whole multi-GPU node per worker pod: engines per pod = GPUs / TP, each with TP bundles of {GPU, CPU}
    plus its actor's CPU; the rendered job runs exactly that many engines on the pod's one model copy."""
    from infra.k8s.instance_types import shape_of
    from infra.k8s.rayjob import PodSize, RayJobArgs, WorkerSpec, fit_job_to_workers
    from tests.infra.k8s_fixtures import IMAGE, job_config

    gpus = shape_of(instance_type).gpus
    workers = WorkerSpec(size=PodSize(cpu=cpu, memory="64Gi", gpus=gpus), min_replicas=1, max_replicas=1)
    job = build_config(job_config().model_dump(mode="json"), {"device": "gpu", "engine.tensor_parallel_size": tp})
    args = RayJobArgs(
        name="llm-batch",
        namespace="llm-batch",
        image=IMAGE,
        service_account="llm-batch-job",
        worker_service_account="llm-batch-worker",
        ray_version="2.60.0",
        job=fit_job_to_workers(job, workers),
        workers=workers,
    )
    assert args.job.replicas == engines and args.job.engine.tensor_parallel_size == tp
    too_few = str(int(cpu) - 1)
    with pytest.raises(ValueError, match=f"workers.size.cpu \\({too_few}\\) cannot hold {engines} engine"):
        RayJobArgs(
            **{
                **args.model_dump(),
                "workers": WorkerSpec(
                    size=PodSize(cpu=too_few, memory="64Gi", gpus=gpus), min_replicas=1, max_replicas=1
                ),
            }
        )


# Two multi-GPU plans as a stack would set them: the workers' pod takes the whole node (its GPUs, most of its CPUs
# and memory), the job's engines are GPUs / TP per pod. Weights from `python -m workload engine-plan`:
# Llama-3.1-70B 131.4 GiB, Llama-3.1-8B 15.0 GiB; the volume is weights x 1.05 + 10 GiB of compile caches.
MULTI_GPU_PLANS = {
    "p4d-70b-tp4": (
        "large",
        {
            "eks.worker_size": {"cpu": "90", "memory": "900Gi", "gpus": 8},
            "eks.node_pool.instance_types": ["p4d.24xlarge"],
            "eks.gpu_max_nodes": 2,
            "job.model_weights_gib": 131.4,
        },
        4,
        "148Gi",
    ),
    "g5.12xlarge-8b-tp2": (
        "medium",
        {
            "eks.gpu_instance_type": "g5.12xlarge",
            "eks.worker_size": {"cpu": "44", "memory": "160Gi", "gpus": 4},
            "job.model_weights_gib": 15.0,
        },
        2,
        "26Gi",
    ),
}


@pytest.mark.parametrize("plan", sorted(MULTI_GPU_PLANS))
def test_a_tensor_parallel_plan_puts_the_nodes_engines_on_one_model_copy(crds_dir: Path, plan: str) -> None:
    """The rendered RayJob of a TP plan on p4d and on g5.12xlarge: one worker group whose pod asks for every GPU of
    its node and the CPUs its engines' placement bundles take, one /models volume per pod (the node's one copy,
    mounted by the Ray container its engines run in) sized from the weights; KubeRay's CRD accepts it."""
    stack, overrides, tp, volume = MULTI_GPU_PLANS[plan]
    config = offline_config(
        stack,
        {
            **overrides,
            "job.model_source": "s3://bucket/models/llama",
            "job.job_overrides": {"engine": {"tensor_parallel_size": tp}},
        },
    )
    args = base_rayjob_args(config, stack, IMAGE, "bucket")
    rayjob = render_rayjob(args)
    assert_valid(rayjob, crds_dir)
    group = _worker_group(rayjob)
    pod = group["template"]["spec"]
    ray = pod["containers"][0]
    node_type = config.eks.node_pool.instance_types[0] if stack == "large" else config.eks.gpu_instance_type
    from infra.k8s.instance_types import shape_of

    node_gpus = shape_of(node_type).gpus
    assert ray["resources"]["limits"][GPU_RESOURCE] == node_gpus == ray["resources"]["requests"][GPU_RESOURCE]
    engines_per_pod = node_gpus // tp
    assert args.job.engine.tensor_parallel_size == tp
    assert args.job.replicas == engines_per_pod * group["maxReplicas"]
    # Each engine takes tp bundles {GPU: 1, CPU: 1} and its actor a CPU.
    assert quantity_value(ray["resources"]["limits"]["cpu"]) >= engines_per_pod * (tp + 1)
    (models,) = [v for v in pod["volumes"] if v["name"] == "models"]
    assert models == {"name": "models", "emptyDir": {"sizeLimit": volume}}
    assert [m["mountPath"] for m in ray["volumeMounts"] if m["name"] == "models"] == [MODELS_DIR]
    assert args.job.model.cache_dir.startswith(MODELS_DIR + "/")
