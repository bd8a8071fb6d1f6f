"""The Batch API: OpenAI's Files and Batches routes over the job (docs/batch-api.md).

One application for every front: `app` (HTTP routes) over `service` (the rules: validation, statuses, counts,
expiry, retention) over a `store.Store` (records and file bodies) and an `executor.Executor` (what runs a batch).
Locally the store is a folder and the executor runs `python -m workload run` per batch; the AWS front of the tiers
brings its own store and executor and reuses the rest. Imports the key mechanism (workload.auth) and the job's
contract (its config and entrypoint), never the job itself: the app runs where no Ray, vLLM or torch is installed.
"""
