"""The Hugging Face hub token in a pod: fetched at start by an init container, never in a manifest or a log.

The init container runs the job image's own Python (boto3 is in it) with the pod's IRSA role, reads the
token from Secrets Manager and writes it, owner-read-only, to an in-memory volume; the Ray container finds it
through `HF_TOKEN_PATH`, as the small tier's node does. A secret with no value stored yet means public models
only.
"""

from __future__ import annotations

from typing import Any

from workload.contract import entrypoint

# The run spec's token folder and file (workload/contract/entrypoint.py), as on the small tier's node.
TOKEN_DIR = entrypoint.HUB_TOKEN_DIR
TOKEN_FILE = entrypoint.HUB_TOKEN_PATH
VOLUME = "hub-token"

# Run as `python -c`; reads its inputs from the environment so the ARN never lands in a command line.
FETCH_SCRIPT = """\
import os

import boto3

secrets = boto3.client("secretsmanager")
arn = os.environ["HUB_TOKEN_SECRET_ARN"]
# A missing secret or no access to it stops the pod; a secret with no value yet means public models only.
versions = secrets.describe_secret(SecretId=arn).get("VersionIdsToStages", {})
if not any("AWSCURRENT" in stages for stages in versions.values()):
    print("no hub token stored: public models only")
    raise SystemExit(0)
token = secrets.get_secret_value(SecretId=arn).get("SecretString", "").strip()
if not token:
    print("hub token secret is empty: public models only")
    raise SystemExit(0)
fd = os.open(os.environ["HUB_TOKEN_PATH"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
with os.fdopen(fd, "w") as handle:
    handle.write(token)
print("hub token written")
"""


def volume() -> dict[str, Any]:
    # In memory: the token never touches the node's disk.
    return {"name": VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}


def init_container(image: str, secret_arn: str, security_context: dict[str, Any]) -> dict[str, Any]:
    # Same image, so same user as the Ray container: the owner-only file stays readable to it alone.
    return {
        "name": "fetch-hub-token",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-c", FETCH_SCRIPT],
        "env": [
            {"name": "HUB_TOKEN_SECRET_ARN", "value": secret_arn},
            {"name": "HUB_TOKEN_PATH", "value": TOKEN_FILE},
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        "securityContext": security_context,
        "volumeMounts": [{"name": VOLUME, "mountPath": TOKEN_DIR}],
    }


def container_env() -> list[dict[str, str]]:
    """What the Ray container needs to find the token (the run spec's TOKEN_ENV; its ENV comes with the pod)."""
    return [{"name": key, "value": value} for key, value in entrypoint.TOKEN_ENV.items()]


def container_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}


def with_token(
    pod: dict[str, Any], image: str, secret_arn: str | None, security_context: dict[str, Any]
) -> dict[str, Any]:
    """The pod spec, fetching the hub token before Ray starts when there is one (every Ray pod may load the model).

    Only the Ray container (KubeRay's is the first) gets the token: a sidecar such as the GPU reporter never loads
    a model."""
    if secret_arn is None:
        return pod
    container = pod["containers"][0]
    container["env"] = [*container.get("env", []), *container_env()]
    container["volumeMounts"] = [*container["volumeMounts"], container_mount()]
    pod["initContainers"] = [init_container(image, secret_arn, security_context)]
    pod["volumes"] = [*pod["volumes"], volume()]
    return pod
