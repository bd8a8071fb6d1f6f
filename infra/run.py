"""`python -m infra.run`: the operator tool lives in `infra/ops/run.py`; this name is kept as its command."""

from infra.ops.run import main

if __name__ == "__main__":
    raise SystemExit(main())
