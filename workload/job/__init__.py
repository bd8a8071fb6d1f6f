"""One run of the batch job and its commit protocol: every input row answered or recorded exactly once.

- `attempt`: one attempt from lease to summary (`run_job`);
- `pool`: several OpenAI batches on one engine, each member's output a lone job's (`run_pool`);
- `committer`: rows coming back from the engine, buffered per shard and committed when a shard is complete;
- `engine_loop`: driving the pipeline's stream, with the engine guard's retries and the stop signal;
- `input_plan`, `input_stream`: the input's plan (listing, sizes, versions) and the stream the cluster reads;
- `rejects`: the rows validation rejects, handed to the driver beside the engine's stream;
- `output`: the output layout and the commit protocol (shards, manifest, markers);
- `lease`: one attempt at a time per output;
- `summary`: `summary.json` and its human version.

May import: `contract`, `files`, `engine`, `telemetry` and the top-level process helpers; nothing from `cli`,
`serve` or `bench`.
"""
