"""`python -m infra.preflight`: the operator tool lives in `infra/ops/preflight.py`; this name is its command."""

from infra.ops.preflight import main

if __name__ == "__main__":
    raise SystemExit(main())
