"""The trainer-facing rollout: the classes a trainer builds and the schedules that run them.

Rule (tests/test_layers.py): may import every layer below it (`core/`, `engine/`,
`retrieval/`); nothing below imports `rollout/`.

- `agent`: `BaseRollout`, `vLLMRollout`, `vLLMRolloutAgent`: an engine and a driver each (re-exported here: `vrag_rollout.rollout` keeps working).
- `driver`: `EpisodeDriver`, the per-turn and per-batch work of every trainer's rollout, engine-free.
- `schedules`: the turn-synchronized and continuous schedules and the one-episode coroutine, over one per-turn step (the `Driver` protocol).
- `tools`: executing a turn's tool calls and building their observations.
- `tool_batcher`: concurrent agent loops' tool calls merged into shared retriever batches.
"""

from .agent import BaseRollout, vLLMRollout, vLLMRolloutAgent

__all__ = ["BaseRollout", "vLLMRollout", "vLLMRolloutAgent"]
