"""`python -m infra.policy`: the operator tool lives in `infra/ops/policy.py`; this name is kept as its command."""

from infra.ops.policy import main
from workload.contract.cli_errors import run_command

if __name__ == "__main__":
    raise SystemExit(run_command("python -m infra.policy", main))
