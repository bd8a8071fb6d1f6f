"""`python -m infra.policy`: the operator tool lives in `infra/rules/registry.py`; this name is kept as its command."""

from infra.rules.registry import main
from workload.contract.cli_errors import run_command

if __name__ == "__main__":
    raise SystemExit(run_command("python -m infra.policy", main))
