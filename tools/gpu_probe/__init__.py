"""The GPU probe: calibrates what engine-plan assumes, on any machine with one GPU, PyTorch and transformers.

Standalone on purpose: the lent GPU machine has PyTorch, transformers, safetensors and triton but no vLLM, Ray,
pydantic or network, so nothing here imports the project or anything beyond the standard library, torch and
transformers. The project's own numbers (the GPU kinds table, the plan's token budgets and sequence counts, the
reserve and roofline constants) come in as a JSON file that `python -m tools.gpu_probe_kit plan` writes beside a
copy of this folder (docs/gpu.md):

    cd gpu-probe-kit && python3 -m gpu_probe --plan plan.json --out result     # on the GPU, under 10 minutes
    python3 -m gpu_probe --plan plan.json --out result --dry                    # on the CPU: tiny shapes, seconds

Steps, each written to result/probe.json as it ends (a run cut off keeps what it measured): `device` (name, CUDA
total and free memory, the kinds-table row it matches), `activations` (the peak of one engine step of a dense and
a MoE model at the plan's budgets), `rates` (GEMM and decode attention at batch sizes 1 to 1,024) and `decode`
(one decode step of max_num_seqs sequences beside the plan's roofline).
"""
