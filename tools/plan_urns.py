"""Record the URN of every resource in each committed stack's offline plan, so a refactor can prove it replaces
nothing: a resource whose URN changes is, to Pulumi, a new resource (the old one is deleted) unless an alias
names its old URN. tests/infra/test_plan_urns.py checks a later plan against the file this writes.

    python tools/plan_urns.py [COMMIT]   # writes tests/infra/data/plan_urns_<COMMIT>.json

COMMIT names the program the plans were made from (default: HEAD); run it on that program, before the change.

The variants are the plans the infra tests already build (tests/infra/conftest.py: `plan_for`, `front_plans`,
`serve_plan`), so the check adds no plan of its own to `make test`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.ops.plan_capture import capture_plan  # noqa: E402  (after the path, as a script run from anywhere)

DATA = ROOT / "tests" / "infra" / "data"
_BATCH_API = {"batch_api.enabled": True, "batch_api.public_endpoint_acknowledged": True}
_SERVE = {"serve.enabled": True, "eks.head_instance_type": "m5.2xlarge"}
# Variant name -> (stack, overrides set over its stack file). Serving exists on the EKS tiers only.
VARIANTS: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "small": ("small", {}),
    "medium": ("medium", {}),
    "large": ("large", {}),
    "small+batch_api": ("small", _BATCH_API),
    "large+batch_api": ("large", _BATCH_API),
    "medium+serve": ("medium", {**_SERVE, "serve.internal_load_balancer": True}),
    "large+serve": ("large", _SERVE),
}


def plan_urns(stack: str, overrides: Mapping[str, Any]) -> list[str]:
    """The sorted URNs of the stack's offline plan with `overrides` set."""
    return sorted(item["urn"] for item in capture_plan(stack, overrides))


def main(argv: list[str]) -> int:
    commit = argv[0] if argv else _head()
    with ThreadPoolExecutor(max_workers=2) as pool:  # each plan runs in an interpreter of its own
        urns = dict(zip(VARIANTS, pool.map(lambda variant: plan_urns(*variant), VARIANTS.values()), strict=True))
    path = DATA / f"plan_urns_{commit}.json"
    document = {"commit": commit, "variants": {name: dict(VARIANTS[name][1]) for name in VARIANTS}, "urns": urns}
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"{path.relative_to(ROOT)}: {sum(map(len, urns.values()))} URNs in {len(urns)} plans")
    return 0


def _head() -> str:
    git = ["git", "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
