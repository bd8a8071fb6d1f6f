"""A real multi-node Ray cluster on this one machine, shaped by the RayJob manifest `infra/k8s/rayjob.py` renders.

What is read from the manifest, not copied: the head's and the workers' `rayStartParams` and the resources of their
Ray containers (turned into `ray start` flags as KubeRay does: num-cpus from the CPU limit, memory from the memory
limit, num-gpus from `nvidia.com/gpu`), the mount paths of the job config, the model cache and /dev/shm, the
ConfigMap's job file, and the entrypoint, which is submitted through Ray's job submission API as KubeRay's
submitter does. So the head runs no actor (num-cpus 0), and each GPU worker holds one engine.

Each node runs in its own mount namespace (`unshare --mount --propagation private`, root only) with private folders
bound where the pod has its own volumes: /models (the models emptyDir), /etc/llm-batch (the ConfigMap),
/dev/shm (a tmpfs, as the pod's memory-backed emptyDir) and /tmp (the pod's own filesystem: Ray's session and
logs). What one node writes there the others never see. All nodes share the host's network, so 127.0.0.1 reaches
the moto server the tests start.

Ray's token authentication is on, as the manifest's `authOptions` has KubeRay set it (infra/k8s/ray_auth.py): the
box makes one random token per cluster, as KubeRay's per-cluster Secret holds, and every node starts with
`RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN`, as KubeRay's env on the Ray containers; the driver inherits it from the
head, and this process, standing in for KubeRay's submitter and operator, sends it as a bearer token.

Where it stands in for what cannot run here: the GPUs are Ray's logical `GPU` resources of the worker nodes (the
engines run on vLLM's CPU build: `VLLM_CPU_KVCACHE_SPACE` in the worker environment stands in for GPU memory),
and the image is this checkout (PYTHONPATH) with this virtualenv's interpreter first on PATH.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.k8s.common import GPU_RESOURCE, quantity_value
from workload.contract.entrypoint import MODELS_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
SHM_SIZE = "1g"
OBJECT_STORE_BYTES = 400 * 2**20  # per node; the tiny model's blocks need little, and memory here is shared
POD_LABEL = "llm-batch-box-pod"  # a Ray node label naming the box's node, so a Ray node id maps to its Node


def can_run() -> str | None:
    """Why the cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "separate mount namespaces per node need root (unshare --mount)"
    if shutil.which("unshare") is None:
        return "util-linux's unshare is not installed"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_start_flags(group: dict[str, Any]) -> list[str]:
    """`ray start` flags for one group of the RayCluster spec: its rayStartParams plus what KubeRay derives from
    the Ray container's resource limits when the params do not set it."""
    params = {key: str(value) for key, value in group.get("rayStartParams", {}).items()}
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    params.setdefault("num-cpus", str(int(quantity_value(str(limits["cpu"])))))
    params.setdefault("memory", str(int(quantity_value(str(limits["memory"])))))
    if GPU_RESOURCE in limits:
        params.setdefault("num-gpus", str(limits[GPU_RESOURCE]))
    return [f"--{key}={value}" for key, value in sorted(params.items())]


def volume_mounts(group: dict[str, Any]) -> dict[str, str]:
    """Volume name -> mount path in the group's Ray container."""
    container = group["template"]["spec"]["containers"][0]
    return {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}


# How many times a worker's `ray start` is run again after it exits before joining (wait_for_nodes).
WORKER_RESTARTS = 2


@dataclass
class Node:
    name: str
    root: Path  # on the host: models/, config/, tmp/ of this node
    process: subprocess.Popen[bytes]
    log: Path
    killed: bool = False  # set by kill(): its exit is the test's doing, not a crash
    restarts: int = 0  # `ray start` runs again after it exited before joining (wait_for_nodes)

    @property
    def models(self) -> Path:
        return self.root / "models"

    def kill(self) -> None:
        """SIGKILL the node: `ray start --block`, its raylet, object store and every worker and engine process."""
        import psutil

        self.killed = True

        try:
            parent = psutil.Process(self.process.pid)
            victims = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for victim in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.send_signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


HOST_TMP_VIEW = "/run/llm-batch-host-tmp"  # inside each node's own mount namespace only


def _rebind_under_tmp(paths: tuple[Path, ...]) -> list[str]:
    """Shell lines that bind each of `paths` lying under /tmp back over the node's private /tmp."""
    lines = []
    for path in sorted({p.resolve() for p in paths}):
        if path.is_relative_to("/tmp"):
            inside = f"{HOST_TMP_VIEW}/{path.relative_to('/tmp')}"
            lines.append(
                f"mkdir -p {shlex.quote(str(path))} && mount --bind {shlex.quote(inside)} {shlex.quote(str(path))}"
            )
    return lines


@dataclass
class Cluster:
    rayjob: dict[str, Any]
    config_map: dict[str, Any]
    workdir: Path
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    head: Node | None = None
    workers: list[Node] = field(default_factory=list)
    # What KubeRay's Secret for the cluster holds: 32 random bytes (base64 there; hex here, equally opaque).
    token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.rayjob["spec"]["rayClusterSpec"])

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def headers(self) -> dict[str, str]:
        """What KubeRay's submitter and operator send the dashboard: the cluster's token as a bearer token."""
        return {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}

    def _state(self) -> Any:
        from ray.util.state.api import StateApiClient

        return StateApiClient(address=self.dashboard_url, headers=self.headers)

    def _list(self, resource: str, **options: Any) -> list[Any]:
        from ray.util.state.common import ListApiOptions, StateResource

        found = self._state().list(
            StateResource(resource), options=ListApiOptions(**options), raise_on_missing_output=False
        )
        return list(found)

    def _env(self, worker: bool) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            PYTHONPATH=str(REPO_ROOT),
            HF_HOME=f"{MODELS_DIR}/huggingface",  # as the image sets it
            HF_HUB_OFFLINE="1",
            TMPDIR="/tmp",
            # A pod's own home: no ~/.ray/auth_token of this machine's (`ray start` would read it).
            HOME="/tmp/home",
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONUNBUFFERED="1",
        )
        for name in (
            "RAY_ADDRESS",
            "VLLM_CACHE_ROOT",
            "TORCHINDUCTOR_CACHE_DIR",
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
        ):
            env.pop(name, None)
        # What KubeRay sets on each Ray container when the cluster spec asks for token authentication.
        if (self.spec.get("authOptions") or {}).get("mode") == "token":
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
        else:
            # No RAY_AUTH_MODE from KubeRay: set it off explicitly, since an earlier in-process `ray.init()` of
            # this test session turns token mode on in os.environ (Ray's local default).
            env["RAY_AUTH_MODE"] = "disabled"
        if worker:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # the stand-in for the GPU's memory: small, the machine is shared
        return env

    def _start(self, name: str, group: dict[str, Any], flags: list[str], worker: bool) -> Node:
        root = self.workdir / name
        mounts = volume_mounts(group)
        binds = {"models": root / "models", "job-config": root / "config", "tmp": root / "tmp"}
        for folder in binds.values():
            folder.mkdir(parents=True, exist_ok=True)
        config_file = self.config_map["data"]
        for file_name, text in config_file.items():
            (root / "config" / file_name).write_text(text)
        for path in (mounts["models"], mounts["job-config"]):
            Path(path).mkdir(parents=True, exist_ok=True)  # mount points on the host; stay empty there
        script = [
            f"mount --bind {shlex.quote(str(binds['models']))} {shlex.quote(mounts['models'])}",
            f"mount --bind {shlex.quote(str(binds['job-config']))} {shlex.quote(mounts['job-config'])}",
            f"mount -t tmpfs -o size={SHM_SIZE} tmpfs {shlex.quote(mounts['dshm'])}",
            # Last: the host paths bound above may lie under /tmp. So may the checkout and its virtualenv (a CI
            # clone under /tmp): they are bound back into the node's own /tmp, read from a view of the host's.
            f"mkdir -p {HOST_TMP_VIEW} && mount --bind /tmp {HOST_TMP_VIEW}",
            f"mount --bind {shlex.quote(str(binds['tmp']))} /tmp",
            *_rebind_under_tmp((REPO_ROOT, Path(sys.prefix))),
            "mkdir -p /tmp/home",
            "exec ray start --block --disable-usage-stats --node-ip-address=127.0.0.1 "
            f"--object-store-memory={OBJECT_STORE_BYTES} --labels={POD_LABEL}={name} "
            f"--dashboard-agent-listen-port={free_port()} --metrics-export-port={free_port()} "
            + " ".join(shlex.quote(flag) for flag in flags),
        ]
        log = self.workdir / f"{name}.log"
        process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "bash", "-ec", "\n".join(script)],
            env=self._env(worker),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return Node(name, root, process, log)

    def start(self, timeout_s: float = 120) -> None:
        head_group = self.spec["headGroupSpec"]
        self.head = self._start(
            "head",
            head_group,
            [
                "--head",
                f"--port={self.gcs_port}",
                f"--dashboard-port={self.dashboard_port}",
                "--include-dashboard=true",
                *ray_start_flags(head_group),
            ],
            worker=False,
        )
        self.wait_for_nodes(1, timeout_s)
        (group,) = self.spec["workerGroupSpecs"]
        for _ in range(int(group["replicas"])):
            self.add_worker()
        self.wait_for_nodes(1 + len(self.workers), timeout_s)

    def _start_worker(self, name: str) -> Node:
        """`ray start` of a pod of the manifest's worker group, joining the head."""
        (group,) = self.spec["workerGroupSpecs"]
        flags = [f"--address=127.0.0.1:{self.gcs_port}", *ray_start_flags(group)]
        return self._start(name, group, flags, worker=True)

    def _restart(self, node: Node) -> None:
        node.log.rename(node.log.with_name(f"{node.name}.{node.restarts}.log"))  # the failed start's reason kept
        node.process = self._start_worker(node.name).process
        node.restarts += 1

    def add_worker(self) -> Node:
        """A new worker pod of the manifest's worker group, with empty volumes of its own: what KubeRay starts
        when a worker pod is lost (the group's `replicas` is fixed when autoscaling is off)."""
        node = self._start_worker(f"worker-{len(self.workers)}")
        self.workers.append(node)
        return node

    def wait_for_nodes(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in [self.head, *self.workers]:
                if node is None or node.killed or node.process.poll() is None:
                    continue
                # A worker pod whose `ray start` gave up (Ray waits a fixed 30 s for its raylet to register:
                # ray/_private/node.py, seen when a replacement started beside two busy engines on 2 cores) is
                # started again, as Kubernetes restarts the pod's container; the head, or a worker that keeps
                # failing, fails the test.
                if node is self.head or node.restarts >= WORKER_RESTARTS:
                    raise RuntimeError(
                        f"{node.name} exited (started again {node.restarts} times): {node.log.read_text()[-3000:]}"
                    )
                self._restart(node)
            if len(self.alive_nodes()) >= count:
                return
            time.sleep(1)
        raise TimeoutError(f"{count} Ray nodes did not come up in {timeout_s:.0f} s")

    def alive_nodes(self) -> list[dict[str, Any]]:
        try:
            nodes = self._list("nodes", filters=[("state", "=", "ALIVE")])
        except Exception:  # the dashboard is still starting
            return []
        return [node.__dict__ if hasattr(node, "__dict__") else dict(node) for node in nodes]

    def all_nodes(self) -> list[dict[str, Any]]:
        return [dict(n.__dict__) for n in self._list("nodes")]

    def node_named(self, ray_node_id: str) -> Node | None:
        """The box's node behind a Ray node id."""
        for state in self.all_nodes():
            if state["node_id"] == ray_node_id:
                name = (state.get("labels") or {}).get(POD_LABEL)
                return next((n for n in [self.head, *self.workers] if n is not None and n.name == name), None)
        return None

    def tasks(self, name_part: str) -> list[dict[str, Any]]:
        """Every attempt of every task whose name holds `name_part` (a rerun is an attempt_number above 0)."""
        found = self._list("tasks", limit=10000, detail=True)
        return [dict(t.__dict__) for t in found if name_part in (t.name or "")]

    def submit(self) -> str:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(self.dashboard_url, headers=self.headers)
        return str(client.submit_job(entrypoint=self.rayjob["spec"]["entrypoint"]))

    def wait(self, job_id: str, timeout_s: float) -> tuple[str, str]:
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(self.dashboard_url, headers=self.headers)
        deadline = time.monotonic() + timeout_s
        status = client.get_job_status(job_id)
        while status not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
            if time.monotonic() > deadline:
                client.stop_job(job_id)
                break
            time.sleep(2)
            status = client.get_job_status(job_id)
        return str(status), client.get_job_logs(job_id)

    def actors(self, class_part: str) -> list[dict[str, Any]]:
        found = self._list("actors", limit=1000, detail=True)
        return [dict(a.__dict__) for a in found if class_part in (a.class_name or "")]

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            if node is not None and node.process.poll() is None:
                node.kill()


def load_manifests(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RayJob, ConfigMap) from what the renderer returned, after a YAML round trip as kubectl would apply it."""
    by_kind = {obj["kind"]: yaml.safe_load(yaml.safe_dump(obj)) for obj in objects}
    return by_kind["RayJob"], by_kind["ConfigMap"]
