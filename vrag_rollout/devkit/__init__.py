"""Developer kits: the command-line jobs (demo, rollout on your own data, learn) and the tiny
offline models of each family.

- `demo`: the main job: a real rollout of a tiny model against the embedded retriever.
- `rollout_job`: `vrag-rollout rollout`: the agent on a user's own converted questions and index.
- `evaluate_job`: `vrag-rollout evaluate`: a checkpoint scored on a converted benchmark as its paper scores it.
- `evaluate_retriever_job`: `vrag-rollout evaluate-retriever`: the index alone scored on a benchmark's questions.
- `job_checks`: what those jobs check before any engine starts (retriever, documents, files).
- `context_flags`: the context-budget flags every engine command takes, parsed and checked.
- `episode_table`: the one-line-per-sample table the rollout jobs print.
- `learn_job`: `vrag-rollout learn`: the closed GRPO loop wired to the engine, retriever and tiny model.
- `learn_task`: the task it learns by default (find the page): questions, ground truths, action grammar.
- `credit_task`: the task where turn credit matters (`learn --task two-pages`): two gold pages, distractors.
- `learn_report`: the reward plot and the one-line summary of a run.
- `learn_checkpoints`: `learn`'s checkpoints (`--save-every`, `--resume`) and its TensorBoard log.
- `tiny_model`: builds a family's tiny random model offline.
- `tiny_families`: the per-family pieces of the tiny models (configs, templates).
- `scripted_sampler`: a stand-in for the engine's sampling (always fetches a page), for benchmarks.
- `planted_defects`: known batch defects planted into a trainer batch, for proving the live guard
  catches them where training runs.
"""
