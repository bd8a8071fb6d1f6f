"""`python -m infra.preflight`: the operator tool lives in `infra/ops/preflight.py`; this name is its command."""

from infra.ops.preflight import main
from workload.contract.cli_errors import run_command

if __name__ == "__main__":
    raise SystemExit(run_command("python -m infra.preflight", main))
