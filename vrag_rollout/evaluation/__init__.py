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
- `protocols`: the named protocols (vrag-rl, document, own), each switch overridable and the override recorded.
- `coverage`: whether a gold page ever entered an episode's context and at which turn; the shown/never-shown split.
- `efficiency`: each episode's cost (turns, sampled and visual tokens, retriever calls, seconds), mean and p90.
- `retriever_metrics`: page-level recall@k, nDCG@k, MMDocIR's page recall and ViDoRe's nDCG@10 of one ranking.
- `retriever_track`: the retriever-only track's per-question metrics, means and report.
- `compare`: two runs' reports side by side, protocol differences named, no subtraction across protocols.
"""
