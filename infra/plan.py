"""`python -m infra.plan`: the operator tool lives in `infra/ops/plan.py`; this name is kept as its command."""

from infra.ops.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
