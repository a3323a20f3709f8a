"""Developer kits: the demo and the tiny offline models of each family.

- `demo`: the main job: a real rollout of a tiny model against the embedded retriever.
- `learn_job`: `vrag-rollout learn`: the closed GRPO loop wired to the engine, retriever and tiny model.
- `learn_task`: the task it learns by default (find the page): questions, ground truths, action grammar.
- `learn_report`: the reward plot and the one-line summary of a run.
- `tiny_model`: builds a family's tiny random model offline.
- `tiny_families`: the per-family pieces of the tiny models (configs, templates).
"""
