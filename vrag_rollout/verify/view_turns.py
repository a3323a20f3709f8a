"""Each turn's share of an episode's reward, for the view (`learn --turn-rewards retrieval`'s split
with the default weights), computed from the batch's own columns: `verify/` imports only `verify/`."""

from __future__ import annotations

from typing import Any, Optional

from . import episode_facts as facts

RETRIEVAL_WEIGHT = 0.1  # core.reward.RewardWeights().retrieval, restated: verify/ imports only verify/


def turn_rewards_html(turn_page_ids: Any, reward: Optional[dict], truth: Any, doc_id: Any = None) -> str:
    """Each turn's reward, the episode's split as `learn --turn-rewards retrieval` splits it (the
    default weights): each distinct page's NDCG term x the retrieval weight to the turn that first
    showed it, the rest of the reward on the last turn; computed here from the pages and the gold
    pages (not by `core.turn_rewards`), so they sum to the episode's reward. "" without the turns'
    pages, the reward's retrieval part or a ground truth."""
    import math

    if turn_page_ids is None or truth is None or not reward or "retrieval" not in reward or not len(turn_page_ids):
        return ""
    gold = len(truth.gold_pages)
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(gold))
    values, seen = [0.0] * len(turn_page_ids), []
    for turn, pages in enumerate(turn_page_ids):
        for page in pages or ():
            if str(page) in seen:
                continue
            seen.append(str(page))
            if ideal and facts.is_gold(str(page), truth, doc_id):
                values[turn] += RETRIEVAL_WEIGHT / math.log2(len(seen) + 1) / ideal
    values[-1] += reward["overall"] - RETRIEVAL_WEIGHT * reward["retrieval"]
    return " · ".join(f"turn {turn} {value:.2f}" for turn, value in enumerate(values, start=1))
