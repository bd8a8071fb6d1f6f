"""The Batch API: OpenAI's Files and Batches routes over the job (docs/batch-api.md).

One application for every front: `app` (HTTP routes), `lambda_front` and `cli` call `service.BatchService` and
nothing else; below it `scheduler` (how a batch moves on; the executor's only caller), `uploads`, `files`,
`batches`, `nights`, over the records layer (`records`: store, clock, sequence, compare-and-swap) and its typed
records (`models`), over a `store.Store` (records and file bodies) and an `executor.Executor` (what runs a
batch). Locally the store is a folder and the executor runs `python -m workload run` per batch; the AWS front of
the tiers brings its own store and executor and reuses the rest. Imports the key mechanism (workload.auth) and the
job's contract (its config and entrypoint), never the job itself: the app runs where no Ray, vLLM or torch is
installed.
"""
