"""`python -m infra.pricing.refresh`: the operator tool lives in `infra/ops/refresh_prices.py`; this name is kept."""

from infra.ops.refresh_prices import main

if __name__ == "__main__":
    raise SystemExit(main())
