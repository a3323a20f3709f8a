"""The only layer that imports vLLM.

Rule (tests/test_layers.py): no module outside `engine/` imports vllm; `engine/` imports
nothing of `core/`, `retrieval/` or `rollout/`.

- `llm`: building the `vllm.LLM` and the two ways of driving it (one generate per turn; requests added and stepped).
- `sampling`: per-request sampling parameters and seeds.
- `group_sync`: tensor-parallel ranks kept in lockstep over vLLM's TP group.
- `input_norms`: repairs to an engine whose weights a trainer syncs in (vision input norms).
- `weights`: syncing a trainer's Hugging Face weights into the running engine, and the logprob check that it serves them.
- `token_server`: token-in/token-out generate calls over a local `LLM`, answering as verl's vLLM server does.
- `async_token_server`: the same over vLLM's async engine, continuously batching concurrent trajectories (benchmarks).
"""
