"""Efficiency of each episode, and its mean and 90th percentile over a group (pure).

Contract: `episode_cost(...)` counts one episode's cost from its batch row:

- `turns`: the episode's generation turns;
- `sampled_tokens`: the tokens the policy sampled (the row's loss mask: observations excluded);
- `visual_tokens`: the image tokens of the pages shown to it (`<|image_pad|>` in its response);
- `retriever_calls`: searches, fetches and crops it made (answered or not);
- `seconds`: its own latency, from its rollout call's start to the turn that ended it (the
  batch's `episode_seconds`: episodes of a batch run together, so the slowest sets the batch's
  time); for a batch without that column, its share of the batch's `rollout/seconds`.

`summarize(costs)` gives, per field, the `mean` and the `p90` (nearest rank: the smallest value
with at least 90 % of the values at or below it) over the episodes that have the field.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

FIELDS = ("turns", "sampled_tokens", "visual_tokens", "retriever_calls", "seconds")


def episode_cost(*, turns: int, loss_mask: Sequence[int], response_ids: Sequence[int], attention: Sequence[int],
                 image_pad_id: int, searches: int, fetches: int, crops: int, seconds: Optional[float]) -> dict:
    return {"turns": int(turns), "sampled_tokens": int(sum(int(m) for m in loss_mask)),
            "visual_tokens": sum(1 for token, used in zip(response_ids, attention) if used and token == image_pad_id),
            "retriever_calls": int(searches) + int(fetches) + int(crops),
            "seconds": None if seconds is None else float(seconds)}


def p90(values: Sequence[float]) -> Optional[float]:
    """Nearest-rank 90th percentile: the ceil(0.9 n)-th smallest value."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def summarize(costs: Sequence[Optional[dict]]) -> dict:
    out = {}
    for name in FIELDS:
        values = [cost[name] for cost in costs if cost and cost.get(name) is not None]
        out[name] = {"mean": sum(values) / len(values) if values else None, "p90": p90(values)}
    return out
