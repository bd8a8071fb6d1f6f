"""`python -m infra.pricing.refresh`: the operator tool lives in `infra/ops/refresh_prices.py`; this name is kept."""

from infra.ops.refresh_prices import main
from workload.contract.cli_errors import run_command

if __name__ == "__main__":
    raise SystemExit(run_command("python -m infra.pricing.refresh", main))
