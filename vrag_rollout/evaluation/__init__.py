"""Evaluating a checkpoint the way each benchmark's paper does. Pure: imports only the standard
library and `vrag_rollout.core`.

- `scorers`: each set's own answer scoring (one module per set) behind `scorer_for(set_name)`.
- `protocol`: every switch that changes a score (scope, turns, capped and unanswerable questions, judge), pinned.
- `results`: `results.jsonl`, the per-question results written as they come, resumable under one header.
- `retrieval`: an episode's retrieval metrics (recall per turn and cumulative, NDCG) from the pages it was shown.
- `report`: the headline table per benchmark and per each set's own categories, as JSON and markdown.
"""
