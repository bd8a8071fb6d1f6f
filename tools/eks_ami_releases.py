"""Write infra/facts/eks_ami_releases.json from amazon-eks-ami's CHANGELOG.md: each release and the Kubernetes
versions it ships an AL2023 x86_64 NVIDIA AMI for (what Karpenter's GPU nodes boot from a pinned alias).

    git clone --depth 1 https://github.com/awslabs/amazon-eks-ami /tmp/amazon-eks-ami
    python tools/eks_ami_releases.py /tmp/amazon-eks-ami/CHANGELOG.md --as-of 2026-07-24 --commit <sha>

Each release's notes (`# AMI Release vYYYYMMDD`) list the AMI names it built, e.g.
`amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714`; a release is kept when it lists at least one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, date, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "infra" / "facts" / "eks_ami_releases.json"
_RELEASE = re.compile(r"^# AMI Release (v\d{8})\s*$", re.MULTILINE)
HOW = "python tools/eks_ami_releases.py CHANGELOG.md of a fresh clone of awslabs/amazon-eks-ami (see the tool)"


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def parse(changelog: str) -> dict[str, list[str]]:
    """Release -> Kubernetes versions with an AL2023 x86_64 NVIDIA AMI in its notes, newest release first."""
    parts = _RELEASE.split(changelog)
    releases: dict[str, list[str]] = {}
    for index in range(1, len(parts), 2):
        release, notes = parts[index], parts[index + 1]
        found = set(re.findall(rf"amazon-eks-node-al2023-x86_64-nvidia-(1\.\d+)-{release}\b", notes))
        if found:
            releases[release] = sorted(found, key=_minor)
    return dict(sorted(releases.items(), reverse=True))


def document(releases: dict[str, list[str]], *, commit: str, as_of: date, checked: date) -> dict[str, object]:
    return {
        "checked": checked.isoformat(),
        "source_as_of": as_of.isoformat(),
        "source": f"awslabs/amazon-eks-ami CHANGELOG.md at commit {commit} (release notes list each AMI "
        "built); the repository's tags name the same releases",
        "how": HOW,
        "releases": {release: {"kubernetes": versions} for release, versions in releases.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("changelog", type=Path, help="amazon-eks-ami's CHANGELOG.md")
    parser.add_argument("--commit", required=True, help="the commit the CHANGELOG was read at")
    parser.add_argument("--as-of", required=True, type=date.fromisoformat, help="that commit's date")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    releases = parse(args.changelog.read_text())
    if not releases:
        print(f"error: no AL2023 NVIDIA AMIs found in {args.changelog}", file=sys.stderr)
        return 2
    today = datetime.now(UTC).date()
    text = json.dumps(document(releases, commit=args.commit, as_of=args.as_of, checked=today), indent=1)
    # One line per release: its versions inline.
    inline = re.sub(r"\[\s+([^\]]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    args.out.write_text(inline + "\n")
    print(f"{len(releases)} releases, newest {next(iter(releases))}, written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
