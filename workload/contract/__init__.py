"""The job's contract with the deploy-time program and the monitoring: all that `infra/` and `monitoring/` may import.

- `config`: the job's typed configuration (what every tier renders and the job loads);
- `serve_config`: the online endpoint's configuration (the job's, plus a `serve` section);
- `entrypoint`: how every tier starts the job (the image's entrypoint and the run spec);
- `metric_names`: every metric, dimension and log field the job publishes and the alarms watch;
- `cli_errors`: the one error boundary every command (`python -m workload ...`, `python -m infra.<tool>`) runs behind;
- `jsonl_lines`: what a request is in a JSONL file, for the job's reader and the Batch API's counts alike;
- `batch_api_quotas`: what one key of the Batch API may hold, set by the stack and read by the front.

May import: the standard library, pydantic and PyYAML; never Ray, vLLM, torch or any other workload package, so a
Pulumi run with the lean deploy set can import it (tests/test_layers.py holds both rules).
"""
