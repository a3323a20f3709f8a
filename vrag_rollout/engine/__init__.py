"""The only layer that imports vLLM.

Rule (tests/test_layers.py): no module outside `engine/` imports vllm; `engine/` imports
nothing of `core/`, `retrieval/` or `rollout/`.

- `llm`: building the `vllm.LLM` and the two ways of driving it (one generate per turn; requests added and stepped).
- `sampling`: per-request sampling parameters and seeds.
- `group_sync`: tensor-parallel ranks kept in lockstep over vLLM's TP group.
- `input_norms`: repairs to an engine whose weights a trainer syncs in (vision input norms).
- `weights`: syncing a trainer's Hugging Face weights into the running engine, and the logprob check that it serves them.
- `stand_ins`: verl's vLLM server played in this process, for `scripts/check_verl.py`, the tests and the benchmarks.
"""
