"""Copy the CRDs the manifest tests validate against from the Karpenter and KubeRay releases the stacks install into
tests/infra/data/crds/, with SOURCES.json (repository, tag, commit, path and sha256 of each file).

    git clone --bare https://github.com/aws/karpenter-provider-aws /tmp/karpenter.git
    git clone --bare https://github.com/ray-project/kuberay /tmp/kuberay.git
    python -m tools.crd_sources --git aws/karpenter-provider-aws=/tmp/karpenter.git \\
        --git ray-project/kuberay=/tmp/kuberay.git

The tag of each is `v` + its Helm chart's version in infra/versions.py, so a chart bump is followed by a rerun
(tests/infra/test_crd_sources.py fails until then). A schema from any other commit is not what the cluster
enforces: a commit after Karpenter v1.14.1 loosened EC2NodeClass's `kubelet` (issue 65, finding 5).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from infra.versions import HELM_CHARTS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "infra" / "data" / "crds"


@dataclass(frozen=True)
class CrdSource:
    chart: str  # its key in infra/versions.py HELM_CHARTS
    repository: str
    path: str  # inside the repository at the chart's tag


# The files the charts install: KubeRay's chart ships its CRDs in helm-chart/kuberay-operator/crds (the same bytes
# as ray-operator/config/crd/bases at v1.7.0); Karpenter's chart's crds/ entries are links to pkg/apis/crds.
SOURCES: dict[str, CrdSource] = {
    "karpenter.sh_nodepools.yaml": CrdSource(
        "karpenter", "aws/karpenter-provider-aws", "pkg/apis/crds/karpenter.sh_nodepools.yaml"
    ),
    "karpenter.k8s.aws_ec2nodeclasses.yaml": CrdSource(
        "karpenter", "aws/karpenter-provider-aws", "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml"
    ),
    "ray.io_rayclusters.yaml": CrdSource(
        "kuberay-operator", "ray-project/kuberay", "helm-chart/kuberay-operator/crds/ray.io_rayclusters.yaml"
    ),
    "ray.io_rayjobs.yaml": CrdSource(
        "kuberay-operator", "ray-project/kuberay", "helm-chart/kuberay-operator/crds/ray.io_rayjobs.yaml"
    ),
    "ray.io_rayservices.yaml": CrdSource(
        "kuberay-operator", "ray-project/kuberay", "helm-chart/kuberay-operator/crds/ray.io_rayservices.yaml"
    ),
}
HOW = (
    "python -m tools.crd_sources --git aws/karpenter-provider-aws=<git dir> --git ray-project/kuberay=<git dir> "
    "(bare clones or fetched snapshots holding the chart tags; see the tool)"
)


def chart_tag(chart: str) -> str:
    """The git tag of the release a pinned chart installs: `v` + the chart's version."""
    return "v" + HELM_CHARTS[chart][1]


def _git(git_dir: Path, *args: str) -> bytes:
    result = subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"error: git {' '.join(args)} in {git_dir}: {result.stderr.decode().strip()}")
    return result.stdout


def copy(git_dirs: dict[str, Path], out: Path) -> dict[str, object]:
    """Write each CRD at its chart's tag into `out`; return SOURCES.json's document."""
    files: dict[str, dict[str, str]] = {}
    for name, source in SOURCES.items():
        if source.repository not in git_dirs:
            raise SystemExit(f"error: no --git {source.repository}=<git dir> given (needed for {name})")
        git_dir, tag = git_dirs[source.repository], chart_tag(source.chart)
        commit = _git(git_dir, "rev-parse", f"{tag}^{{commit}}").decode().strip()
        text = _git(git_dir, "show", f"{commit}:{source.path}")
        (out / name).write_bytes(text)
        files[name] = {
            "chart": source.chart,
            "repository": source.repository,
            "tag": tag,
            "commit": commit,
            "path": source.path,
            "sha256": hashlib.sha256(text).hexdigest(),
        }
    return {"read": datetime.now(UTC).date().isoformat(), "how": HOW, "files": files}


def _git_arg(value: str) -> tuple[str, Path]:
    repository, sep, path = value.partition("=")
    if not sep or "/" not in repository:
        raise argparse.ArgumentTypeError(f"{value!r} is not OWNER/NAME=GIT_DIR")
    return repository, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git", type=_git_arg, action="append", required=True, metavar="OWNER/NAME=GIT_DIR")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    document = copy(dict(args.git), args.out)
    (args.out / "SOURCES.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"{len(SOURCES)} CRDs written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
