"""The RayJob renderer: objects checked against KubeRay's real CRDs, and the rules the schema can't see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra.k8s.common import DO_NOT_DISRUPT, GPU_RESOURCE, GPU_TAINT_KEY, POOL_LABEL
from infra.k8s.rayjob import (
    ENTRYPOINT,
    RayJobArgs,
    WorkerSpec,
    fit_job_to_workers,
    for_night,
    render_config_map,
    render_job,
    render_ray_cluster_spec,
    render_rayjob,
)
from tests.infra.crd_schema import assert_valid, crd_errors
from tests.infra.k8s_fixtures import IMAGE, job_config, large_args, medium_args
from workload.config import load_config

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
    assert "tolerations" not in head
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
    (container,) = pod["containers"]
    assert container["resources"]["limits"][GPU_RESOURCE] == 1
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["serviceAccountName"] == _head(rayjob)["serviceAccountName"] == "llm-batch-job"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_medium_is_a_fixed_cluster_of_the_configured_size() -> None:
    spec = render_rayjob(medium_args())["spec"]["rayClusterSpec"]
    group = _worker_group({"spec": {"rayClusterSpec": spec}})
    assert spec["enableInTreeAutoscaling"] is False
    assert "autoscalerOptions" not in spec
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2


def test_large_autoscales_one_to_eight_and_is_shielded_from_consolidation() -> None:
    rayjob = render_rayjob(large_args())
    spec = rayjob["spec"]["rayClusterSpec"]
    group = _worker_group(rayjob)
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 60
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
    with pytest.raises(
        ValidationError, match=r"tensor_parallel_size .2. is more than the GPUs of one worker"
    ):
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
