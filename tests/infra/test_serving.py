"""The online endpoint on the EKS tiers (issue 23): planned with `serve.enabled` on and off, its RayService against
KubeRay's CRD, its own GPU pool (the starvation rule), its cost, alarms and dashboard, and the policy rules on it.

Plans come from the real program under the plan's mocks (`capture_plan`), with `serve.*` set over the committed
stack files as `python -m infra.plan --set` does; each is made once per session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import StackConfig, StackConfigError, decode_pulumi_values, load_stack_config
from infra.eks_job import base_rayjob_args
from infra.eks_serve import rayservice_manifest
from infra.k8s.common import GPU_POOL, POOL_LABEL
from infra.k8s.network_policy import SERVE_PORT
from infra.k8s.rayjob import render_rayjob
from infra.k8s.rayservice import INTERNAL_LB_ANNOTATIONS, SERVE_POOL, llm_deployment_name, serve_config_v2
from infra.ops.stacks import read_stack_config
from infra.pricing.estimate import NIGHTS_PER_MONTH, estimate
from infra.pricing.stack_costs import capacity_pools, estimate_inputs, run_hourly_usd
from infra.pricing.table import load_prices
from infra.rules import checks_k8s
from infra.rules.registry import gate
from monitoring.alarms import serve_alarms
from tests.infra.conftest import SERVE_ON, SERVE_OVERRIDES, Plan
from tests.infra.crd_schema import assert_valid
from workload.contract import metric_names as mn

KEYS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-large/serve-api-keys-AbCdEf"

OVERRIDES = SERVE_OVERRIDES
PRICES = load_prices()
RAYSERVICE = "kubernetes:ray.io/v1:RayService"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
GROUP = "eks:index:ManagedNodeGroup"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"


def _config(stack: str, **overrides: Any) -> StackConfig:
    values, _ = read_stack_config(stack, overrides)
    return load_stack_config(stack, decode_pulumi_values(values))


def _of(plan: Plan, typ: str) -> list[dict[str, Any]]:
    return [item for item in plan if item["type"] == typ]


def _serve_alarm_names(plan: Plan) -> set[str]:
    return {item["name"] for item in _of(plan, ALARM) if "serve-" in item["name"]}


@pytest.mark.parametrize("tier", ["medium", "large"])
def test_serving_off_leaves_nothing_of_it_in_the_plan_or_the_estimate(tier: str, plan_for) -> None:
    plan = plan_for(tier)
    assert not _of(plan, RAYSERVICE) and not _of(plan, "llmbatch:serving:Serving")
    # Karpenter's own pools: the nightly GPU workers' (one-GPU and eight-GPU, Spot and on-demand fallback) and the
    # Ray head's on-demand nodes (from 0), none for serving.
    nightly = ("gpu-spot", "gpu-on-demand", "gpu8-spot", "gpu8-on-demand", "head")
    assert not [item for item in _of(plan, NODE_POOL) if item["inputs"]["metadata"]["name"] not in nightly]
    assert not [item for item in _of(plan, GROUP) if item["name"].startswith("serving")]
    assert not _serve_alarm_names(plan)
    assert not [item for item in _of(plan, "aws:secretsmanager/secret:Secret") if "serve-api-keys" in item["name"]]
    dashboard = next(item for item in plan if item["type"] == "aws:cloudwatch/dashboard:Dashboard")
    assert "Endpoint" not in dashboard["inputs"]["dashboardBody"]
    exports = next(item for item in plan if item["type"] == "pulumi:pulumi:Stack")
    assert "serve_endpoint" not in json.dumps(exports)
    config = _config(tier)
    result = estimate(estimate_inputs(tier, config, PRICES), PRICES)
    assert result.subtotal("serving") == 0 and not [item for item in result.items if item.group == "serving"]


@pytest.mark.parametrize("tier", ["medium", "large"])
def test_serving_on_plans_a_valid_rayservice_that_passes_every_policy_rule(tier: str, serve_plan, crds_dir) -> None:
    plan = serve_plan(tier)
    gate(plan)  # k8s-exposure, pod-security, worker-identity, ray-network-policy and the rest: no violation
    (service,) = _of(plan, RAYSERVICE)
    assert_valid(service["inputs"], crds_dir)
    cluster = service["inputs"]["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (workers,) = cluster["workerGroupSpecs"]
    assert (workers["minReplicas"], workers["maxReplicas"]) == (0, 2)  # serve.min_replicas 0, max 2
    worker = workers["template"]["spec"]
    assert worker["automountServiceAccountToken"] is False and worker["serviceAccountName"] == "llm-batch-serve-worker"
    # The same image as the nightly job's (the plan's one image), and the application the local endpoint builds.
    exports = next(item for item in plan if item["type"] == "pulumi:pulumi:Stack")["outputs"]
    image = json.loads(exports["rayjob_args"])["image"]
    assert {
        c["image"] for c in [*worker["containers"], *cluster["headGroupSpec"]["template"]["spec"]["containers"]]
    } == {image}
    assert exports["serve_endpoint"] == f"http://llm-batch-serve-serve-svc.llm-batch.svc.cluster.local:{SERVE_PORT}/v1"
    # Nothing reachable from the internet; the Serve port admitted from the VPC only.
    (policy,) = [item for item in _of(plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy") if "serve" in item["name"]]
    ingress = policy["inputs"]["spec"]["ingress"]
    assert ingress == [
        {"from": [{"ipBlock": {"cidr": "10.40.0.0/16"}}], "ports": [{"port": SERVE_PORT, "protocol": "TCP"}]}
    ]
    # Alarms and dashboard.
    assert _serve_alarm_names(plan) == {
        "observability-alarm-serve-latency",
        "observability-alarm-serve-error-ratio",
        "observability-alarm-serve-at-max-replicas",
    }
    dashboard = next(item for item in plan if item["type"] == "aws:cloudwatch/dashboard:Dashboard")
    body = json.loads(dashboard["inputs"]["dashboardBody"])
    charted = {m[1] for w in body["widgets"] if w["type"] == "metric" for m in w["properties"]["metrics"] if len(m) > 2}
    assert {metric.name for metric in mn.SERVE_METRICS} <= charted


def test_medium_serves_from_its_own_managed_group_and_an_internal_load_balancer(serve_plan) -> None:
    plan = serve_plan("medium")
    groups = {item["name"]: item["inputs"] for item in _of(plan, GROUP)}
    serve, nightly = groups["serving-gpu"], groups["nodes-gpu"]
    assert serve["labels"] == {POOL_LABEL: SERVE_POOL} and nightly["labels"] == {POOL_LABEL: GPU_POOL}
    assert serve["capacityType"] == "ON_DEMAND" and serve["instanceTypes"] == ["g5.xlarge"]
    assert serve["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 2}
    assert serve["taints"] == nightly["taints"]  # GPU pods only
    (service,) = _of(plan, RAYSERVICE)
    lb = service["inputs"]["spec"]["serveService"]
    assert lb["spec"]["type"] == "LoadBalancer" and lb["metadata"]["annotations"] == INTERNAL_LB_ANNOTATIONS
    # The exposure rule sees the load balancer KubeRay will make: without the internal scheme it is refused.
    bare = json.loads(json.dumps(service))
    bare["inputs"]["spec"]["serveService"]["metadata"]["annotations"] = {}
    assert checks_k8s.exposure_problems(bare) == [
        "spec.serveService: LoadBalancer Service without the internal scheme: an internet-facing load balancer"
    ]
    assert checks_k8s.exposure_problems(service) == []


def test_large_serves_from_its_own_nodepool_bounded_to_max_replicas(serve_plan, crds_dir) -> None:
    plan = serve_plan("large")
    pools = {item["inputs"]["metadata"]["name"]: item["inputs"] for item in _of(plan, NODE_POOL)}
    for pool in pools.values():
        assert_valid(pool, crds_dir)
    serve, nightly = pools["gpu-serve"], pools["gpu-spot"]
    assert serve["spec"]["template"]["metadata"]["labels"] == {POOL_LABEL: SERVE_POOL}
    assert nightly["spec"]["template"]["metadata"]["labels"] == {POOL_LABEL: GPU_POOL}
    assert serve["spec"]["limits"]["nvidia.com/gpu"] == "2"  # serve.max_replicas x 1 GPU, nothing more
    assert nightly["spec"]["limits"]["nvidia.com/gpu"] == "16"  # the nightly pool's own, unchanged
    capacity = next(r for r in serve["spec"]["template"]["spec"]["requirements"] if r["key"].endswith("capacity-type"))
    assert capacity["values"] == ["on-demand"]
    (service,) = _of(plan, RAYSERVICE)
    assert "serveService" not in service["inputs"]["spec"]  # KubeRay's default: a ClusterIP Service


@pytest.mark.parametrize("tier", ["medium", "large"])
def test_the_endpoint_and_the_nightly_job_never_share_gpu_nodes(tier: str, serve_plan) -> None:
    """The starvation rule: each workload's GPU pods select a pool label that only its own nodes carry."""
    plan = serve_plan(tier)
    config = _config(tier, **OVERRIDES[tier])
    nightly_job = render_rayjob(base_rayjob_args(config, tier, "repo/image:1", "bucket"))
    (nightly_workers,) = nightly_job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (service,) = _of(plan, RAYSERVICE)
    (serve_workers,) = service["inputs"]["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    nightly_pool = nightly_workers["template"]["spec"]["nodeSelector"][POOL_LABEL]
    serve_pool = serve_workers["template"]["spec"]["nodeSelector"][POOL_LABEL]
    # The pool label each source of GPU nodes puts on its nodes.
    labels = [
        item["inputs"]["labels"][POOL_LABEL]
        for item in _of(plan, GROUP)
        if item["inputs"]["labels"][POOL_LABEL] not in ("head", "system")
    ]
    labels += [
        item["inputs"]["spec"]["template"]["metadata"]["labels"][POOL_LABEL]
        for item in _of(plan, NODE_POOL)
        if item["inputs"]["spec"]["template"]["metadata"]["labels"][POOL_LABEL] != "head"
    ]
    # The night's pools: medium's one group; large's two worker groups, each a Spot pool and its on-demand fallback.
    night_labels = {"gpu"} if tier == "medium" else {"gpu", "gpu8"}
    assert labels.count(serve_pool) == 1 and set(labels) == {*night_labels, serve_pool}
    assert nightly_pool in night_labels and serve_pool not in night_labels


def test_rayservice_renders_valid_for_both_tiers_with_the_job_model_and_engine(crds_dir: Path) -> None:
    for tier in ("medium", "large"):
        overrides = {
            **SERVE_ON,
            "serve.min_replicas": 1,
            "serve.max_replicas": 3,
            "serve.internal_load_balancer": True,
            "job.model_source": "Qwen/Qwen3-0.6B",
            "job.model_weights_gib": 1.1,
            "job.job_overrides": {"engine": {"max_model_len": 2048}},
        }
        config = _config(tier, **overrides)
        manifest = rayservice_manifest(
            config, tier, "123.dkr.ecr.us-east-1.amazonaws.com/w:abc", "arn:secret", KEYS_ARN
        )
        assert_valid(manifest, crds_dir)
        serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
        (app,) = serve_config["applications"]
        assert app["import_path"] == "workload.serve.cluster:app" and serve_config["proxy_location"] == "HeadOnly"
        endpoint = app["args"]["config"]
        assert endpoint["model"]["source"] == "Qwen/Qwen3-0.6B" and endpoint["engine"]["max_model_len"] == 2048
        assert endpoint["device"] == "gpu" and endpoint["serve"]["port"] == SERVE_PORT
        (deployment,) = app["deployments"]
        assert deployment["autoscaling_config"]["min_replicas"] == 1
        assert deployment["autoscaling_config"]["max_replicas"] == 3


def test_config_refuses_serving_where_it_cannot_run() -> None:
    base = {"cost_center": "x"}
    assert not load_stack_config("medium", base).serve.enabled  # off by default
    with pytest.raises(StackConfigError, match="EKS tiers"):
        load_stack_config("small", {**base, "serve": {"enabled": True}})
    # The default head node holds the nightly head only: the RayService's head counts in the sizing check.
    with pytest.raises(StackConfigError, match="RayService ray head"):
        load_stack_config("medium", {**base, "serve": {"enabled": True}})
    with pytest.raises(StackConfigError, match=r"min_replicas \(3\) is more than max_replicas \(2\)"):
        load_stack_config("medium", {**base, "serve": {"min_replicas": 3}})
    with pytest.raises(StackConfigError, match="'port' is set by the RayService"):
        load_stack_config("medium", {**base, "serve": {"endpoint_overrides": {"port": 80}}})
    with pytest.raises(StackConfigError, match=r"serve\.endpoint_overrides: invalid serve config"):
        load_stack_config(
            "large",
            {
                **base,
                "eks": {"head_instance_type": "m5.2xlarge"},
                "serve": {"enabled": True, "endpoint_overrides": {"max_ongoing_requests": 0}},
            },
        )
    with pytest.raises(StackConfigError, match="fits no node of instance_type"):
        load_stack_config("medium", {**base, "serve": {"worker_size": {"cpu": "8", "memory": "12Gi", "gpus": 1}}})


@pytest.mark.parametrize("tier", ["medium", "large"])
def test_estimate_prices_the_endpoint_gpu_hours(tier: str) -> None:
    config = _config(tier, **SERVE_ON)
    result = estimate(estimate_inputs(tier, config, PRICES), PRICES)
    on_demand = PRICES.instance(config.region, "g5.xlarge").on_demand_hourly
    busy_hours = 8 * NIGHTS_PER_MONTH  # serve.busy_hours_per_day's default
    serving = [item for item in result.items if item.group == "serving" and item.unit == "instance-hour"]
    (instances,) = [item for item in serving if item.item.startswith("endpoint replicas")]
    assert instances.quantity == pytest.approx(2 * busy_hours) and instances.unit_price == on_demand
    # The RayService keeps its own head all month (the head pool never empties while it serves): in this group.
    (head,) = [item for item in serving if "ray head node" in item.item]
    head_hourly = PRICES.instance(config.region, "m5.2xlarge").on_demand_hourly
    assert head.quantity == pytest.approx(730) and head.unit_price == head_hourly
    replicas = 2 * busy_hours * on_demand + 2 * 200 * busy_hours / 730 * 0.08
    assert result.subtotal("serving") == pytest.approx(replicas + 730 * head_hourly + 200 * 0.08)
    # The job's own price per hour (its cost per token) is the nightly pool's, whatever the endpoint costs.
    assert run_hourly_usd(config, PRICES) == run_hourly_usd(_config(tier), PRICES)
    # The quota check counts the endpoint at its largest beside the night's nodes: both may run at once.
    required, _ = capacity_pools(config, PRICES)
    assert [(p.instance_type, p.count, p.capacity) for p in required if p.name.startswith("endpoint")] == [
        ("m5.2xlarge", 1, "on-demand"),  # its Ray head's node
        ("g5.xlarge", 2, "on-demand"),
    ]
    # One replica kept warm adds the rest of the day for one node; Spot capacity is priced at Spot.
    warm = _config(tier, **SERVE_ON, **{"serve.min_replicas": 1, "serve.capacity_type": "spot"})
    items = [
        item for item in estimate(estimate_inputs(tier, warm, PRICES), PRICES).items if item.unit == "instance-hour"
    ]
    floor = next(item for item in items if "idle floor" in item.item)
    assert floor.quantity == pytest.approx(730 - busy_hours)
    assert floor.unit_price == PRICES.instance(config.region, "g5.xlarge").spot_hourly


def test_serve_alarms_are_accepted_by_cloudwatch_and_watch_the_reporter_metrics(moto_endpoint: str) -> None:
    import boto3

    config = _config("large", **SERVE_ON)
    specs = serve_alarms("large", config.monitoring.metrics_namespace, config.serve.watch)
    published = {metric.name for metric in mn.SERVE_METRICS}
    client = boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=moto_endpoint)
    for spec in specs:
        assert {ref.name for ref in spec.metrics()} <= published
        assert all(ref.dimensions == {mn.DIM_STACK: "large"} for ref in spec.metrics())
        client.put_metric_alarm(**spec.put_metric_alarm_kwargs(f"t-{spec.key}", []))
    names = {alarm["AlarmName"] for alarm in client.describe_alarms(AlarmNamePrefix="t-serve")["MetricAlarms"]}
    assert names == {"t-serve-latency", "t-serve-error-ratio", "t-serve-at-max-replicas"}
    at_max = next(spec for spec in specs if spec.key == "serve-at-max-replicas")
    assert at_max.threshold == config.serve.max_replicas


def test_the_endpoint_pool_leaves_room_for_an_upgrade_s_new_cluster() -> None:
    from infra.eks_serve import serve_worker_ceiling

    assert serve_worker_ceiling(_config("large", **SERVE_ON)) == 2  # min 0: the new cluster starts with no worker
    warm = _config("large", **SERVE_ON, **{"serve.min_replicas": 1, "serve.max_replicas": 3})
    assert serve_worker_ceiling(warm) == 4
    manifest = rayservice_manifest(warm, "large", "r/i:1", api_keys_secret_arn=KEYS_ARN)
    assert manifest["spec"]["upgradeStrategy"] == {"type": "NewCluster"}


def test_serve_config_targets_the_engine_deployment_by_its_serve_llm_name() -> None:
    config = _config("medium", **SERVE_ON, **{"serve.endpoint_overrides": {"model_id": "org/m.v1"}})
    from infra.eks_serve import rayservice_args

    (app,) = serve_config_v2(rayservice_args(config, "medium", "r/i:1", api_keys_secret_arn=KEYS_ARN))["applications"]
    assert app["deployments"][0]["name"] == llm_deployment_name("org/m.v1") == "LLMServer:org--m_v1"


def test_the_network_rule_admits_the_vpc_on_the_serve_port_only() -> None:
    def rule(cidr: str, port: int) -> dict[str, Any]:
        return {"ingress": [{"from": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}]}

    assert checks_k8s.ray_policy_problems(rule("10.40.0.0/16", SERVE_PORT)) == []
    assert checks_k8s.ray_policy_problems(rule("0.0.0.0/0", SERVE_PORT)) == [
        "ingress[0] admits the address block 0.0.0.0/0"
    ]
    assert checks_k8s.ray_policy_problems(rule("10.40.0.0/16", 6379)) == [
        "ingress[0] admits the address block 10.40.0.0/16"
    ]
    unbounded = {"ingress": [{"from": [{"ipBlock": {"cidr": "10.40.0.0/16"}}]}]}  # every port
    assert checks_k8s.ray_policy_problems(unbounded) == ["ingress[0] admits the address block 10.40.0.0/16"]


def test_pod_security_reads_every_pod_of_the_rayservice() -> None:
    config = _config("large", **SERVE_ON)
    manifest = rayservice_manifest(config, "large", "r/i:1", "arn:secret", KEYS_ARN)
    pods = dict(checks_k8s.pod_specs(manifest))
    head = "spec.rayClusterConfig.headGroupSpec.template.spec"
    worker = "spec.rayClusterConfig.workerGroupSpecs[0].template.spec"
    assert set(pods) == {head, worker}
    # The head's containers: Ray, the metrics reporter and KubeRay's autoscaler sidecar.
    assert [c["name"] for c in pods[head]["containers"]] == ["ray-head", "serve-reporter", "autoscaler"]
    assert all(checks_k8s.pod_security_problems(pod) == [] for pod in pods.values())
    bad = json.loads(json.dumps(manifest))
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["securityContext"] = {
        "privileged": True
    }
    problems = checks_k8s.pod_security_problems(dict(checks_k8s.pod_specs(bad))[worker])
    assert "container ray-worker is privileged" in problems


def test_each_gpu_worker_fetches_the_model_into_its_own_volume_and_the_head_holds_none() -> None:
    """The replicas fetch the model on their own nodes (workload/serve/replica_model.py): the worker pods mount a
    node-disk volume sized as the nightly workers' at the job's cache; the head has neither volume nor hub token."""
    model = {"job.model_source": "s3://weights/models/qwen", "job.model_weights_gib": 1.1}
    config = _config("large", **SERVE_ON, **model)
    manifest = rayservice_manifest(config, "large", "r/i:1", "arn:secret", KEYS_ARN)
    cluster = manifest["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    (group,) = cluster["workerGroupSpecs"]
    worker = group["template"]["spec"]
    nightly = render_rayjob(base_rayjob_args(_config("large", **model), "large", "r/i:1", "bucket"))
    nightly_worker = nightly["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]

    def models_volume(pod: dict[str, Any]) -> dict[str, Any]:
        (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
        return volume

    assert models_volume(worker) == models_volume(nightly_worker)  # node disk (no hostPath, no memory), same size
    assert "medium" not in models_volume(worker)["emptyDir"] and "hostPath" not in models_volume(worker)
    (ray,) = [c for c in worker["containers"] if c["name"] == "ray-worker"]
    (mount,) = [m for m in ray["volumeMounts"] if m["name"] == "models"]
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["args"]["config"]
    assert served["model"]["source"] == "s3://weights/models/qwen"
    assert served["model"]["cache_dir"].startswith(mount["mountPath"] + "/")  # the replica's fetch lands on it
    assert [c["name"] for c in worker.get("initContainers", [])] == ["fetch-hub-token"]

    assert "models" not in {v["name"] for v in head["volumes"]}
    assert all(m["name"] != "models" for c in head["containers"] for m in c.get("volumeMounts", []))
    assert "initContainers" not in head  # no hub token where no model is fetched


def test_plan_set_overrides_reach_the_config_and_bad_ones_are_named() -> None:
    from infra.ops.plan import parse_sets
    from infra.ops.stacks import PlanError

    sets = parse_sets(["serve.enabled=true", "serve.max_replicas=3", "eks.head_instance_type=m5.2xlarge"])
    assert sets == {"serve.enabled": True, "serve.max_replicas": 3, "eks.head_instance_type": "m5.2xlarge"}
    config = _config("large", **sets)
    assert config.serve.enabled and config.serve.max_replicas == 3
    assert config.monitoring.batch_latency_p95_max_s == 180  # the file's own nested keys are kept
    with pytest.raises(PlanError, match="expected KEY=VALUE"):
        parse_sets(["serve.enabled"])
    with pytest.raises(PlanError, match="not an object"):
        read_stack_config("large", {"region.x": 1})


def _list(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize("tier", ["medium", "large"])
def test_the_replicas_read_their_api_keys_from_the_stacks_secret_and_only_that_one(tier: str, serve_plan) -> None:
    """The secret is the stack's (its key, no value from Pulumi: the operator puts the keys), named as configured;
    the pods' role may read it by its ARN (no wildcard); the replicas are told its ARN and region."""
    plan = serve_plan(tier)
    secrets = {item["inputs"]["name"]: item for item in _of(plan, "aws:secretsmanager/secret:Secret")}
    keys = secrets[f"llm-batch-{tier}/serve-api-keys"]
    assert keys["inputs"]["kmsKeyId"], "the API keys secret is not on the stack's key"
    versions = _of(plan, "aws:secretsmanager/secretVersion:SecretVersion")
    assert not [item for item in versions if "serve-api-keys" in item["name"]], "Pulumi must not hold the keys"
    # The replicas' own roles (infra/components/serve_identity.py, issue 60) read it; no other policy does.
    statements = [
        (item["name"], statement)
        for item in [*_of(plan, "aws:iam/policy:Policy"), *_of(plan, "aws:iam/rolePolicy:RolePolicy")]
        for statement in json.loads(item["inputs"]["policy"])["Statement"]
        if "secretsmanager:GetSecretValue" in statement["Action"]
    ]
    readable = {arn for _, statement in statements for arn in _list(statement["Resource"])}
    assert keys["outputs"]["arn"] in readable and not any("*" in arn for arn in readable), readable
    readers = {name for name, statement in statements if keys["outputs"]["arn"] in _list(statement["Resource"])}
    assert readers == {"serve-identity-head-policy", "serve-identity-worker-policy"}
    (service,) = _of(plan, RAYSERVICE)
    (app,) = yaml.safe_load(service["inputs"]["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["config"]["serve"]["api_key_secret"] == keys["outputs"]["arn"]
    cluster = service["inputs"]["spec"]["rayClusterConfig"]
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        env = {item["name"]: item.get("value") for item in template["spec"]["containers"][0]["env"]}
        assert env["AWS_REGION"] and "LLM_BATCH_API_KEY" not in env


def test_a_rayservice_without_its_api_keys_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="needs its API keys' secret"):
        rayservice_manifest(_config("large", **SERVE_ON), "large", "r/i:1")
    with pytest.raises(ValueError, match="'api_key_secret' is set by the RayService"):
        _config("large", **SERVE_ON, **{"serve.endpoint_overrides": {"api_key_secret": "mine"}})
