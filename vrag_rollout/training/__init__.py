"""The trainer side of the loop: a policy update of the Hugging Face model from rollout batches.

- `grpo`: GRPO advantages and the clipped policy loss, taken from verl's `core_algos` (not
  re-typed), over the batch's loss mask; the HF model's response log-probs; one update step.
- `segments`: a segmented batch (context edits: several rows an episode) trained per episode: one
  GRPO advantage an episode, and loss weights that count an episode once whatever its rows.
- `segment_credit`: turn credit on a segmented batch, per episode (the estimator over the final
  rows, each token's advantage given to the row that trained it).
- `estimators`: turn-level advantage estimators over per-turn rewards (grpo, turn, gigpo), pure.
- `turn_credit`: a batch's per-turn rewards and its advantages by estimator (what `learn` calls).
- `credit_check`: an independent check of a batch's turn credit (right turn, sampled tokens only).
- `learn`: the closed loop's steps (rollout, reward, GRPO step, sync, gap check, metrics.jsonl)
  with its rollout and weight sync passed in as callables.

Layer rule: `training/` may import `training/`, `core/` and the leaf modules (`config`,
`protocol`, `families`), plus torch, transformers and verl; never vLLM, `engine/`, `retrieval/`
or `rollout/` (it consumes a finished batch and knows nothing of how it was rolled out).
"""
