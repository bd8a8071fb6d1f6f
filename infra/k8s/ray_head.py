"""The Ray head's pod template, one for the nightly RayJob and the serving RayService.

Both heads run the workload image on the head pool, as the image's user, with Ray's ports; they differ in what
they mount and carry (the job's config and model cache; the endpoint's port and metrics reporter), which the
callers pass in. One template keeps the two from drifting apart in what every Ray head must have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.k8s.common import head_toleration
from workload.contract import entrypoint

# Ray's GCS, dashboard (the job API) and client ports: what KubeRay's head Service exposes.
RAY_PORTS = ({"name": "gcs-server", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265})
CLIENT_PORT = {"name": "client", "containerPort": 10001}


def head_template(
    *,
    metadata: Mapping[str, Any],
    image: str,
    resources: Mapping[str, Any],
    container_security: Mapping[str, Any],
    env: Sequence[Mapping[str, str]],
    mounts: Sequence[Mapping[str, Any]],
    volumes: Sequence[Mapping[str, Any]],
    service_account: str,
    node_selector: Mapping[str, str],
    extra_ports: Sequence[Mapping[str, Any]] = (),
    sidecars: Sequence[Mapping[str, Any]] = (),
    pod_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The head's pod template. `pod_options` go between the service account and the node selector (the
    RayJob's token mount and grace period), in the order the rendered manifests have always had."""
    container = {
        "name": "ray-head",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [*(dict(port) for port in RAY_PORTS), dict(CLIENT_PORT), *map(dict, extra_ports)],
        "resources": dict(resources),
        "securityContext": dict(container_security),
        "env": [dict(item) for item in env],
        "volumeMounts": [dict(mount) for mount in mounts],
    }
    spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        **(pod_options or {}),
        "nodeSelector": dict(node_selector),
        "tolerations": [head_toleration()],
        # Every container of a Ray pod (Ray, sidecar, init, KubeRay's autoscaler) runs as the image's user.
        "securityContext": entrypoint.pod_security_context(),
        # KubeRay treats the first container as Ray's; sidecars come after it.
        "containers": [container, *map(dict, sidecars)],
        "volumes": [dict(volume) for volume in volumes],
    }
    return {"metadata": dict(metadata), "spec": spec}
