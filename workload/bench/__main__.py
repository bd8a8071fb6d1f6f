"""`python -m workload.bench ...`: the same command as `python -m workload bench ...`."""

import sys

from workload.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
