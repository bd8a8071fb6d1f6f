"""The batch job: Ray Data LLM + vLLM over a night's rows, every row answered or recorded exactly once.

One package per layer, each saying in its docstring what it owns and what it may import
(tests/test_layers.py holds the directions):

- `contract`: what infra and monitoring may import (config, run spec, metric names, error boundary);
- `job`: one run and its commit protocol (attempt, committer, input plan and stream, output, lease, summary);
- `files`: storage (local and S3) and the row formats;
- `engine`: the Ray Data LLM stages around vLLM, the crash guard, the model;
- `telemetry`: metrics, CloudWatch, reporters, start-up marks, the terminal's progress;
- `cli`: the commands; `serve`: the online endpoint; `bench`: the benchmarks;
- top level: the process a run owns (`runtime`), what its Ray left behind (`leftovers`), test kill points
  (`failpoints`).
"""
