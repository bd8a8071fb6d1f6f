"""`python -m infra.status`: the operator tool lives in `infra/ops/status.py`; this name is kept as its command."""

from infra.ops.status import main
from workload.contract.cli_errors import run_command

if __name__ == "__main__":
    raise SystemExit(run_command("python -m infra.status", main))
