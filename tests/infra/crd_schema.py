"""Validate generated custom resources against the real CRD schemas in tests/infra/data/crds: those of the
Karpenter and KubeRay releases the stacks install (tools/crd_sources.py; tests/infra/test_crd_sources.py).

The check is stricter than a plain JSON-schema run: Kubernetes silently prunes fields a structural schema
does not name, so a misspelt field would vanish on apply instead of failing. Here every object schema that
lists its properties (and does not preserve unknown fields) rejects the others, as
`kubectl apply --validate=strict` does.
Karpenter's CEL rules (x-kubernetes-validations) are not evaluated; the renderers check the ones that matter.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_FILES = {
    ("ray.io", "RayJob"): "ray.io_rayjobs.yaml",
    ("ray.io", "RayCluster"): "ray.io_rayclusters.yaml",
    ("ray.io", "RayService"): "ray.io_rayservices.yaml",
    ("karpenter.sh", "NodePool"): "karpenter.sh_nodepools.yaml",
    ("karpenter.k8s.aws", "EC2NodeClass"): "karpenter.k8s.aws_ec2nodeclasses.yaml",
}


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        result = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in result
            and "additionalProperties" not in result
            and not result.get("x-kubernetes-preserve-unknown-fields")
        ):
            result["additionalProperties"] = False
        return result
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@functools.cache
def _schema(crds_dir: Path, group: str, kind: str, version: str) -> dict[str, Any]:
    try:
        filename = CRD_FILES[(group, kind)]
    except KeyError:
        raise AssertionError(f"no CRD known for {group}/{kind}") from None
    crd = yaml.load((crds_dir / filename).read_text(), Loader=yaml.CSafeLoader)
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            assert entry["served"], f"{group}/{version} {kind} is not served by this CRD"
            return _strict(copy.deepcopy(entry["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"{filename} has no version {version}")


def crd_errors(manifest: dict[str, Any], crds_dir: Path) -> list[str]:
    """Every schema violation of `manifest`, as 'path: message' lines (empty when it is valid)."""
    group, _, version = manifest["apiVersion"].partition("/")
    validator = jsonschema.Draft7Validator(_schema(crds_dir, group, manifest["kind"], version))
    return [
        f"{'.'.join(str(part) for part in error.absolute_path) or '(root)'}: {error.message}"
        for error in sorted(validator.iter_errors(manifest), key=lambda error: list(error.absolute_path))
    ]


def assert_valid(manifest: dict[str, Any], crds_dir: Path) -> None:
    errors = crd_errors(manifest, crds_dir)
    assert not errors, f"{manifest['kind']} {manifest['metadata'].get('name')} fails its CRD:\n" + "\n".join(errors)
