"""verl's vLLM server, played in this process over the project's engine: what
`scripts/check_verl.py`, the tests and the benchmarks run verl's agent loop against, without Ray
or a GPU. Not used by a training run (verl brings its own server).

- `token_server`: token-in/token-out generate calls over a local `LLM`, answering as verl's vLLM server does.
- `async_token_server`: the same over vLLM's async engine, continuously batching concurrent trajectories (benchmarks).
"""
