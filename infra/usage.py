"""`python -m infra.usage`: the operator tool lives in `infra/ops/usage.py`; this name is its command."""

from infra.ops.usage import main
from workload.contract.cli_errors import run_command

if __name__ == "__main__":
    raise SystemExit(run_command("python -m infra.usage", main))
