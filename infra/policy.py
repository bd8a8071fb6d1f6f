"""`python -m infra.policy`: the operator tool lives in `infra/ops/policy.py`; this name is kept as its command."""

from infra.ops.policy import main

if __name__ == "__main__":
    raise SystemExit(main())
