"""The nightly run's hands inside the VPC: submits, follows and removes the RayJob, and scales GPU capacity.

Step Functions' EKS integration needs a public cluster endpoint; this function runs in the cluster's VPC,
so it reaches a private endpoint too. It authenticates the way `aws eks get-token` does (a presigned STS
GetCallerIdentity URL as the bearer token) and talks to the Kubernetes API over TLS checked against the
cluster's CA. It imports only the standard library and boto3, both in the Lambda runtime.

Actions (the event's "action"):
- capacity_up: node-group tiers set the GPU node group to its run size; Karpenter tiers need nothing
  (Karpenter launches nodes for the pending Ray pods).
- submit: create the night's job-config ConfigMap and RayJob from the packaged template (removing earlier
  attempts first).
- status: where the RayJob is: running, succeeded or failed, and whether a failure is worth a retry.
- release: delete the nightly RayJobs (their RayClusters go with them) and ConfigMaps, and take the GPU
  capacity away.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

MANAGED_BY = "llm-batch-nightly"
# Where each kind lives in the API (namespaced); the night template holds only these kinds.
COLLECTIONS = {
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "RayJob": "/apis/ray.io/v1/namespaces/{namespace}/rayjobs",
}
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "night_template.json"
# The run id the template was rendered with (infra.nightly_template.RUN_ID_MARKER; this package cannot
# import infra, a test keeps the two equal).
RUN_ID_MARKER = "nightlyrunid"
# A RayJob whose entrypoint itself failed is the job's own failure: running it again fails again.
# Any other failure (submission, lost head or worker pods, deadlines of the deployment) is the platform's.
NOT_RETRYABLE_REASONS = {"AppFailed", "ValidationFailed"}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")  # workload/batch_api/objects.py new_id


class ConfigError(ValueError):
    """The function's environment is incomplete or wrong."""


@dataclass(frozen=True)
class Settings:
    cluster_name: str
    api_server: str
    ca_pem: str
    namespace: str
    capacity_mode: str
    region: str
    template_path: Path
    nodegroup: str = ""
    gpu_nodes: int = 0
    karpenter_nodepool: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)

        def need(key: str) -> str:
            value = env.get(key, "").strip()
            if not value:
                raise ConfigError(f"environment variable {key} is not set")
            return value

        api_server = need("API_SERVER")
        if not api_server.startswith("https://"):
            raise ConfigError(f"API_SERVER must be an https:// URL, got {api_server!r}")
        try:
            ca_pem = base64.b64decode(need("CLUSTER_CA"), validate=True).decode()
        except ValueError as error:
            raise ConfigError(f"CLUSTER_CA is not base64 PEM data: {error}") from error
        mode = need("CAPACITY_MODE")
        settings = cls(
            cluster_name=need("CLUSTER_NAME"),
            api_server=api_server.rstrip("/"),
            ca_pem=ca_pem,
            namespace=need("NAMESPACE"),
            capacity_mode=mode,
            region=need("AWS_REGION"),
            template_path=Path(env.get("RAYJOB_TEMPLATE") or DEFAULT_TEMPLATE),
            nodegroup=env.get("NODEGROUP", ""),
            gpu_nodes=_int(env.get("GPU_NODES", "0"), "GPU_NODES"),
            karpenter_nodepool=env.get("KARPENTER_NODEPOOL", ""),
        )
        if mode == "nodegroup" and (not settings.nodegroup or settings.gpu_nodes < 1):
            raise ConfigError("CAPACITY_MODE=nodegroup needs NODEGROUP and GPU_NODES >= 1")
        if mode == "karpenter" and not settings.karpenter_nodepool:
            raise ConfigError("CAPACITY_MODE=karpenter needs KARPENTER_NODEPOOL")
        if mode not in ("nodegroup", "karpenter"):
            raise ConfigError(f"CAPACITY_MODE must be 'nodegroup' or 'karpenter', got {mode!r}")
        return settings


def _int(value: str, key: str) -> int:
    try:
        return int(value)
    except ValueError as error:
        raise ConfigError(f"{key} must be an integer, got {value!r}") from error


def eks_token(cluster_name: str, region: str) -> str:
    """A bearer token for the EKS API server: a presigned STS GetCallerIdentity URL naming the cluster."""
    sts = boto3.client("sts", region_name=region, endpoint_url=f"https://sts.{region}.amazonaws.com")

    def name_the_cluster(request: Any, **_: Any) -> None:
        request.headers["x-k8s-aws-id"] = cluster_name

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", name_the_cluster)
    url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=60, HttpMethod="GET")
    return "k8s-aws-v1." + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


class KubeError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"Kubernetes API {method} {path} answered {status}: {body[:500]}")
        self.status = status


class Kube:
    """The few Kubernetes API calls the nightly run needs, over TLS verified against the cluster CA."""

    def __init__(self, api_server: str, ca_pem: str, token: str) -> None:
        self.api_server = api_server
        self.context = ssl.create_default_context(cadata=ca_pem)
        self.token = token

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.api_server + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/json",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=20) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            raise KubeError(error.code, method, path, error.read().decode(errors="replace")) from error
        result: dict[str, Any] = json.loads(payload) if payload else {}
        return result

    def list(self, path: str, selector: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"labelSelector": selector})
        items: list[dict[str, Any]] = self.call("GET", f"{path}?{query}").get("items", [])
        return items


def night_objects(
    template: list[dict[str, Any]], date: str, attempt: int, output_uri: str, batch: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One night's objects (the job-config ConfigMap, then the RayJob) from the deploy-time template.

    The template was rendered by infra.nightly_template with RUN_ID_MARKER as its run id and `{date}` in its
    input and output; a run id per date and attempt makes each retry a new RayJob on the same output.
    `batch`: the state machine's run of a Batch API batch (its PlanBatch: batch_id, input_uri, output_uri); the
    run id is the batch's, and the job runs on the batch's file and output (`--input`/`--output`, which the job
    puts over its config's; it tells an OpenAI batch file by its first line, whose url is the batch's endpoint),
    without the night's image prefix (`--no-image-prefix`).
    """
    if not _DATE.match(date):
        raise ValueError(f"date must be YYYY-MM-DD, got {date!r}")
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    kinds = [obj.get("kind") for obj in template]
    if kinds.count("RayJob") != 1 or kinds[-1] != "RayJob" or set(kinds) - set(COLLECTIONS):
        raise ValueError(f"the night template must be ConfigMaps then one RayJob, got kinds {kinds}")
    text = json.dumps(template)
    if RUN_ID_MARKER not in text or "{date}" not in text:
        raise ValueError(f"the night template lacks the run id marker {RUN_ID_MARKER!r} or a {{date}} prefix")
    run_id = f"{date.replace('-', '')}-a{attempt}"
    if batch is not None:
        batch_id, batch_in = str(batch.get("batch_id", "")), str(batch.get("input_uri", ""))
        if not _BATCH_ID.match(batch_id):
            raise ValueError(f"batch_id must be batch_<24 hex>, got {batch_id!r}")
        if not batch_in.startswith("s3://") or str(batch.get("output_uri")) != output_uri:
            raise ValueError(f"a batch's run needs its s3:// input and the watched output, got {batch!r}")
        run_id = f"{batch_id.replace('_', '-')}-a{attempt}"  # RayJob names are DNS labels: no '_'
    objects: list[dict[str, Any]] = json.loads(text.replace(RUN_ID_MARKER, run_id).replace("{date}", date))
    if batch is not None:
        # --no-image-prefix: the night's job.image_prefix is the operator's, never a tenant's (a batch's images are
        # its own data: URLs and uploads).
        flags = f" --input {shlex.quote(str(batch['input_uri']))} --output {shlex.quote(output_uri)} --no-image-prefix"
        objects[-1]["spec"]["entrypoint"] = f"{objects[-1]['spec']['entrypoint']}{flags}"
    if output_uri not in json.dumps(objects):
        # The state machine and the job config build the output from the same stack config; if they ever
        # disagree, a resume would look in one place and write to another.
        raise ValueError(f"the night's job config does not write to {output_uri} (the state machine's output)")
    for obj in objects:
        obj["metadata"].setdefault("labels", {})["app.kubernetes.io/managed-by"] = MANAGED_BY
    return objects


def rayjob_phase(rayjob: dict[str, Any]) -> dict[str, Any]:
    """running / succeeded / failed, and whether a failure is the platform's (retry) or the job's."""
    status = rayjob.get("status", {})
    deployment = status.get("jobDeploymentStatus", "")
    job = status.get("jobStatus", "")
    reason = status.get("reason", "")
    detail = f"{reason or deployment or 'unknown'}: {status.get('message', '')}".strip()
    if deployment == "Complete" and job == "SUCCEEDED":
        phase = "succeeded"
    elif deployment in ("Failed", "ValidationFailed") or job in ("FAILED", "STOPPED"):
        phase = "failed"
    else:
        phase = "running"
    retryable = phase == "failed" and reason not in NOT_RETRYABLE_REASONS and job != "FAILED"
    return {
        "phase": phase,
        "retryable": retryable,
        "reason": detail,
        "job_status": job,
        "deployment_status": deployment,
    }


class Nightly:
    def __init__(self, settings: Settings, kube: Kube, eks: Any) -> None:
        self.settings = settings
        self.kube = kube
        self.eks = eks
        self.collections = {kind: path.format(namespace=settings.namespace) for kind, path in COLLECTIONS.items()}

    def capacity_up(self, event: dict[str, Any]) -> dict[str, Any]:
        if self.settings.capacity_mode == "nodegroup":
            self._scale_nodegroup(self.settings.gpu_nodes)
            return {"capacity": f"node group {self.settings.nodegroup} at {self.settings.gpu_nodes}"}
        return {"capacity": "Karpenter provisions GPU nodes for the pending Ray pods"}

    def submit(self, event: dict[str, Any]) -> dict[str, Any]:
        template = json.loads(self.settings.template_path.read_text())
        run = event.get("run") or {}
        batch = run if run.get("batch_id") else None  # the state machine passes its run; a night's has no batch_id
        objects = night_objects(template, str(event["date"]), int(event["attempt"]), str(event["output_uri"]), batch)
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            if namespace != self.settings.namespace:
                raise ValueError(
                    f"the night template's {obj['kind']} is in namespace {namespace!r}, "
                    f"not NAMESPACE={self.settings.namespace!r}"
                )
        name = str(objects[-1]["metadata"]["name"])
        # Earlier attempts go first: two drivers on one output would each redo the other's shards.
        removed = [job for job in self._delete_nightly("RayJob") if job != name]
        self._delete_nightly("ConfigMap", keep={obj["metadata"]["name"] for obj in objects})
        for obj in objects:
            try:
                self.kube.call("POST", self.collections[obj["kind"]], obj)
            except KubeError as error:
                if error.status != 409:  # 409: a retried invocation already created it
                    raise
        return {"name": name, "removed": removed}

    def status(self, event: dict[str, Any]) -> dict[str, Any]:
        name = str(event["name"])
        try:
            rayjob = self.kube.call("GET", f"{self.collections['RayJob']}/{name}")
        except KubeError as error:
            if error.status == 404:
                return {
                    "phase": "failed",
                    "retryable": True,
                    "reason": f"RayJob {name} is gone",
                    "job_status": "",
                    "deployment_status": "",
                }
            raise
        return {"name": name, **rayjob_phase(rayjob)}

    def release(self, event: dict[str, Any]) -> dict[str, Any]:
        deleted = self._delete_nightly("RayJob")
        self._delete_nightly("ConfigMap")
        if self.settings.capacity_mode == "nodegroup":
            self._scale_nodegroup(0)
            capacity = f"node group {self.settings.nodegroup} at 0"
        else:
            # KARPENTER_NODEPOOL lists every GPU NodePool of the night (Spot pools and their on-demand fallbacks).
            pools = [pool.strip() for pool in self.settings.karpenter_nodepool.split(",") if pool.strip()]
            claims = [claim for pool in pools for claim in self.kube.list(NODECLAIMS, f"karpenter.sh/nodepool={pool}")]
            for claim in claims:
                self._delete(f"{NODECLAIMS}/{claim['metadata']['name']}")
            capacity = f"deleted {len(claims)} NodeClaim(s) of NodePool {', '.join(pools)}"
        return {"deleted_rayjobs": deleted, "capacity": capacity}

    def _delete_nightly(self, kind: str, keep: set[str] | None = None) -> list[str]:
        """Delete every object of `kind` this function created (by its label), but those in `keep`."""
        path = self.collections[kind]
        names = [
            obj["metadata"]["name"]
            for obj in self.kube.list(path, f"app.kubernetes.io/managed-by={MANAGED_BY}")
            if obj["metadata"]["name"] not in (keep or set())
        ]
        for name in names:
            self._delete(f"{path}/{name}")
        return names

    def _delete(self, path: str) -> None:
        try:
            # Background propagation: the RayJob's RayCluster and pods are garbage-collected after it.
            self.kube.call("DELETE", path, {"propagationPolicy": "Background"})
        except KubeError as error:
            if error.status != 404:
                raise

    def _scale_nodegroup(self, size: int) -> None:
        self.eks.update_nodegroup_config(
            clusterName=self.settings.cluster_name,
            nodegroupName=self.settings.nodegroup,
            scalingConfig={"minSize": 0, "desiredSize": size},
        )


ACTIONS = ("capacity_up", "submit", "status", "release")


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    action = event.get("action")
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    settings = Settings.from_env()
    kube = Kube(settings.api_server, settings.ca_pem, eks_token(settings.cluster_name, settings.region))
    nightly = Nightly(settings, kube, boto3.client("eks", region_name=settings.region))
    result: dict[str, Any] = getattr(nightly, str(action))(event)
    return result
