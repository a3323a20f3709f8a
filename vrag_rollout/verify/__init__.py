"""Verification of rollout batches, independent of the code that made them: saved ones offline,
and a trainer's batch live (`guard`).

Rule (tests/test_layers.py): imports only `verify/` (its independence from the rollout is its
value: it recomputes from the model's own code what the rollout claims).

- `saved_batch`: the saved-batch file format (save, load, validate).
- `check`: the independent checker, a package of one module per check (masks, image tokens,
  positions, logprobs, ...).
- `image_entries`: any kind of `multi_modal_data` image entry (PIL, bytes, `{"bytes"}`,
  `{"path"}`, paths, arrays, page entries) as bytes or pixels; the only image reader here.
- `guard`: the live guard: `check`'s structural facts on a trainer batch in memory (no forward
  pass; mrope by a vectorised rule on every sample, by `get_rope_index` on a drawn share), and
  what to do with a bad sample (`fail`, `drop`, `warn`, `off`); the run's first bad samples
  saved for `view`.
- `emptying`: `drop`'s repair of a sample the trainer's forward pass could not take (response
  emptied, prompt images kept only where they match, page columns and positions re-derived).
- `drift`: per-turn gaps between the trainer's log-probs of a batch and the rollout's.
- `view`: a self-contained HTML view of a batch, opening on its episodes.
- `view_segments`: the view of a segmented batch (context edits): an episode's rows side by side,
  with what each edit changed.
- `view_turns`: each turn's share of an episode's reward, as the view shows it.
- `view_html`: the HTML pieces the view's modules share (counted nouns, image data URIs).
- `episode_facts`: what the view says of an episode besides its tokens (question, ground truth,
  the reward the batch carries, why a `budget` end happened); shows, never computes, a reward.
"""
