"""Ray's token authentication on the EKS tiers, as KubeRay sets it up from `authOptions`.

Ray (2.52 and later; the image runs `versions.RAY_VERSION`) refuses unauthenticated calls to its GCS and raylet
gRPC services, the dashboard and job API and every node's dashboard agent when its processes run with
`RAY_AUTH_MODE=token` and a token in `RAY_AUTH_TOKEN`. KubeRay (1.5.1 and later: `MIN_KUBERAY`) does the wiring
when a RayCluster, RayJob or RayService says `authOptions: {mode: token}`:

- it creates a Secret named after the RayCluster holding 32 random bytes (base64) under `auth_token`, owned by the
  RayCluster, so the token is made in the cluster, differs per cluster (so per night) and goes with it;
- it sets `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` (a `secretKeyRef` to that Secret) on the Ray container of the
  head and of every worker, on the workers' `wait-gcs-ready` init container, on its autoscaler sidecar and on the
  RayJob's submitter container, and reads the Secret itself for its own calls to the dashboard;
- it skips a variable a container already sets (`EnvVarExists`), so a template setting `RAY_AUTH_MODE` would win
  over it: the renderers never set one, and the `ray-isolation` rule refuses a template that does.

The token is never a manifest literal, a Pulumi secret or a log line: no one outside the cluster needs it. The
driver inherits it from the head's Ray processes; the sidecars (GPU and Serve reporters) call no Ray API; Ray
Serve's HTTP proxy (`SERVE_PORT`) is the application's endpoint and takes no Ray token, so serving clients need
none. `enableK8sTokenAuth` is not used: KubeRay refuses it for RayJob and RayService.
"""

from __future__ import annotations

from typing import Any

# The first KubeRay release that reads `authOptions` (its v1.5.1 release notes; v1.5.0's API has no such field).
MIN_KUBERAY = (1, 5, 1)
# The first Ray with token authentication (KubeRay's validation refuses `mode: token` below it).
MIN_RAY = (2, 52, 0)
# What KubeRay sets and a template must leave to it.
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def auth_options() -> dict[str, Any]:
    """The RayCluster spec's `authOptions`: token mode, the token in the Secret KubeRay makes per cluster."""
    return {"mode": "token"}


def version_tuple(version: str) -> tuple[int, ...]:
    """'1.7.0' -> (1, 7, 0); a leading 'v' and any pre-release suffix are ignored."""
    core = version.strip().removeprefix("v").split("-", 1)[0]
    return tuple(int(part) for part in core.split("."))
