"""The engine: Ray Data LLM's stages around vLLM, the guard that bounds a crash, and the model every node loads.

- `pipeline`: chat template -> tokenize -> vLLM engine, built from the job config;
- `guard`: a bounded answer to an engine crash (retry, bisect, isolate the culprit row);
- `model_source`: `model.source` turned into a local folder on each node, with its caches;
- `node_stages`: the tokenizer stages, fetching the model on the node they run on;
- `tiny_model`: the embedded random-weight model of the demo and the tests;
- `auto_settings`: engine settings left at `auto`, sized on the engine's GPU at start (contract.engine_sizing).

May import: `contract`, `files`, `telemetry` and the top-level process helpers; never `job` (the job drives the
engine, not the reverse), `cli`, `serve` or `bench`.
"""
