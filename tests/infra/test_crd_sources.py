"""Issue 65, finding 5: the CRD schemas the manifest tests use are those of the Karpenter and KubeRay releases the
stacks install, not of a later commit. Before, they came from a Karpenter commit after v1.14.1 whose EC2NodeClass
lets `spec.kubelet` hold anything (`x-kubernetes-preserve-unknown-fields`), so a kubelet field v1.14.1 rejects
passed here. The copies are checked against SOURCES.json (tools/crd_sources.py) and the pins in infra/versions.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from infra.k8s.karpenter import render_node_class
from tests.conftest import CRDS_DIR
from tests.infra.crd_schema import CRD_FILES, assert_valid, crd_errors
from tests.infra.k8s_fixtures import node_class_args
from tools.crd_sources import SOURCES, chart_tag


def _recorded() -> dict[str, Any]:
    files: dict[str, Any] = json.loads((CRDS_DIR / "SOURCES.json").read_text())["files"]
    return files


def test_each_crd_is_the_pinned_release_s_file_byte_for_byte(crds_dir: Path) -> None:
    # What every manifest test gets: the project's copies, never a folder outside the repository.
    assert crds_dir == CRDS_DIR == Path(__file__).resolve().parent / "data" / "crds"
    recorded = _recorded()
    assert set(recorded) == set(CRD_FILES.values()) == set(SOURCES), "SOURCES.json, the validator and the tool differ"
    on_disk = {path.name for path in CRDS_DIR.glob("*.yaml")}
    assert on_disk == set(recorded), f"files without a source, or sources without a file: {on_disk ^ set(recorded)}"
    for name, entry in recorded.items():
        source = SOURCES[name]
        # The chart's version now, not the one the copy was made at: a bump fails here until the copies follow.
        assert entry["tag"] == chart_tag(source.chart), (
            f"{name} is from {entry['tag']} but infra/versions.py pins {source.chart} {chart_tag(source.chart)}: "
            "rerun `python -m tools.crd_sources` (see the tool)"
        )
        assert (entry["repository"], entry["path"]) == (source.repository, source.path)
        assert len(entry["commit"]) == 40
        digest = hashlib.sha256((CRDS_DIR / name).read_bytes()).hexdigest()
        assert digest == entry["sha256"], f"{name} was edited after it was copied from {entry['tag']}"


def _with_kubelet(kubelet: dict[str, Any]) -> dict[str, Any]:
    node_class = render_node_class(node_class_args())
    node_class["spec"]["kubelet"] = kubelet
    return node_class


@pytest.mark.parametrize(
    ("kubelet", "error"),
    [
        ({"maxPod": 110}, "spec.kubelet: Additional properties are not allowed ('maxPod' was unexpected)"),
        ({"maxPods": "110"}, "spec.kubelet.maxPods: '110' is not of type 'integer'"),
        ({"imageGCHighThresholdPercent": 120}, "spec.kubelet.imageGCHighThresholdPercent: 120 is greater than"),
    ],
)
def test_v1_14_1_s_kubelet_schema_rejects_what_a_later_commit_let_through(kubelet: dict[str, Any], error: str) -> None:
    errors = crd_errors(_with_kubelet(kubelet), CRDS_DIR)
    assert any(line.startswith(error) for line in errors), errors


def test_a_kubelet_block_v1_14_1_accepts_passes() -> None:
    """The strict schema still takes the fields it names, so the rejections above are about the fields."""
    assert_valid(_with_kubelet({"maxPods": 110, "imageGCHighThresholdPercent": 85}), CRDS_DIR)
