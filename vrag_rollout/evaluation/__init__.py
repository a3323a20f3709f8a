"""Evaluating a checkpoint the way each benchmark's paper does. Pure: imports only the standard
library and `vrag_rollout.core`.

- `scorers`: each set's own answer scoring (one module per set) behind `scorer_for(set_name)`.
- `protocol`: every switch that changes a score (scope, turns, capped and unanswerable questions, samples
  and temperature, judge, VRAG-RL's search rule), pinned.
- `constant_eval`: Python's `eval` of an answer for constant expressions only (the published scripts `eval`).
- `search_rule`: VRAG-RL's rule that an answer scores only after a search.
- `index_identity`: the searched index as the retriever reports it, for the results header.
- `results`: `results.jsonl`, the per-sample results written as they come, resumable under one header.
- `retrieval`: an episode's retrieval metrics (recall per turn and cumulative, NDCG) from the pages it was shown.
- `report`: the whole header, then the headline table (pass@1, and pass@k with several samples) per
  benchmark and per each set's own categories, as JSON and markdown.
- `progress`: the lines `evaluate` prints while it runs (the plan, what a resume found, each batch).
"""
