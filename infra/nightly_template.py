"""The deploy-time template the VPC submit function turns into each night's ConfigMap and RayJob.

Rendered once by the Pulumi program from the EKS tiers' RayJob (infra.eks_job) with a marker run id and
the `{date}` prefixes left in; the function (which cannot import infra or pydantic) swaps in the date and
attempt. Keeping the rendering here means the nightly RayJob is the one infra/k8s validates.
"""

from __future__ import annotations

import json

from infra.eks_job import night_manifests
from infra.k8s.rayjob import RayJobArgs

#: Must equal infra/functions/submit_rayjob/handler.py RUN_ID_MARKER (a test checks).
RUN_ID_MARKER = "nightlyrunid"


def night_template(base: RayJobArgs) -> list[dict[str, object]]:
    """The night's objects with the marker run id; `base` carries `{date}` in its input and output URIs."""
    for key, uri in (("input", base.job.input.uri), ("output", base.job.output.uri)):
        if uri.count("{date}") != 1:
            raise ValueError(f"the nightly RayJob's {key} URI {uri!r} must contain {{date}} exactly once")
    return night_manifests(base, run_id=RUN_ID_MARKER, input_uri=base.job.input.uri, output_uri=base.job.output.uri)


def night_template_json(base: RayJobArgs) -> str:
    return json.dumps(night_template(base), indent=1, sort_keys=True)
