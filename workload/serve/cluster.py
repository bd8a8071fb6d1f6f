"""The endpoint's application as a Ray Serve application builder, for a RayService's `serveConfigV2`.

`import_path: workload.serve.cluster:app` with `args: {config: <ServeConfig as a dict>}` builds the very app that
`python -m workload serve` runs locally (`workload.serve.app.build_app`), from the same config model. The builder
runs on the head and touches no model and no storage: each engine replica fetches the model on its own GPU node
(workload/serve/replica_model.py), and a source that cannot be had fails that replica with the source's own error,
which Serve reports in the deployment's status. A bad config fails the build with the config's own error, which
Serve reports as the application's status; so does an endpoint with no API key source (it binds 0.0.0.0). The
builder names the keys' source to the replicas and reads no key: a secret the replicas cannot read fails them.
"""

from __future__ import annotations

import os
from typing import Any

from workload.contract.serve_config import build_serve_config


def app(args: dict[str, Any]) -> Any:
    from workload.serve.app import build_app
    from workload.serve.guard import guard_settings

    if "config" not in args:
        raise ValueError("the application's args need a `config` (the endpoint's ServeConfig as a mapping)")
    config = build_serve_config(args["config"])
    # The keys' source is named (serve.api_key_secret on the tiers); the replicas read it, the builder does not.
    # serve.host is 0.0.0.0 there (infra.config's serve_config): keys are required.
    guard = guard_settings(config, os.environ, key_folder=None, read_now=False)
    return build_app(config, guard)
