"""The benchmark: continuous batching vs a synchronous engine vs this project's job, with a full scorecard.

`python -m workload bench --out DIR [--profile NAME]` (or `python -m workload.bench`). Each mode runs in its
own process (`workload.bench.worker`) so its memory, start-up and clean-up are its own; the parent only
orchestrates, scores and plots.
"""
