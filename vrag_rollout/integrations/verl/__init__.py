"""The agent in volcengine verl's agent-loop rollout (docs/verl.md).

- `agent_loop`: `VragAgentLoop`, registered as `vrag_agent` when imported (it imports verl, so
  nothing imports it unless verl is used).
- `images`: a row's prompt images, in each shape verl's dataset writes them, as RGB images.
- `turns`: a turn's finish and text recovered from verl's token-level answer (pure).
- `reward`: the project's reward in verl's `compute_score` signature.
- `local`: verl's worker in this process over a local engine (the check script and the tests).
- `guard`: the live guard in verl's path: `GuardedAgentLoopWorker` inspects each batch after
  verl's postprocessing, `GuardedAgentLoopManager` (verl's `agent_loop_manager_class`) spawns such
  workers and puts the `guard/` counts and per-turn drift into the trainer's metrics.
- `segments`: a context policy's episode as one `AgentLoopOutput` per row, and the trainer
  settings that could not train them as one episode, refused at loop init.
- `v1_rows`: verl's v1 trainer (TransferQueue) manager and worker: rows scored by the last one,
  each trajectory through the live guard before it is stored (`GuardedRowsManager`); `v1_view`
  (a trajectory's rows as the guard reads them, emptied when dropped) and `v1_metrics` (the
  verdicts into the v1 step's `guard/` metrics) are its parts.
- `pages`: `PagedAgentLoopWorker`, whose trajectories share each page's image-processor outputs
  (the processor runs once per distinct page); the guard's worker is one.
- `turn_estimators`: `vrag_turn` and `vrag_gigpo` in verl's advantage-estimator registry
  (`algorithm.adv_estimator`), with the batch's turn columns through `compute_advantage`.
- `peer_tools`: verl `BaseTool`s `search` and `fetch` over the project's retriever, for running
  verl's own `tool_agent` loop side by side with `vrag_agent` (scripts/bench_verl.py).
"""
