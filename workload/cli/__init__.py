"""`python -m workload run|validate|show|serve|bench|bench-serve`: flags onto the one config model, then the job.

- `commands`: the parser and the commands;
- `show`: `python -m workload show OUTPUT`, what a run left, read back from its output.

May import: every workload package; nothing imports it but `workload.__main__` and the tests.
"""
