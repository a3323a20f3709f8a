"""Retrieval metrics of one episode, from the pages it was shown (pure).

Contract: `retrieval_metrics(turn_page_ids, ground_truth)` reads the rollout's `turn_page_ids`
(per turn, the page ids `<doc>_<page>` its observations showed, in order) and a ground truth as
`core.reward` reads it (gold pages as numbers of the row's document, or `[document, page]`
pairs in corpus scope), and returns

- `recall_per_turn[t]`: the share of the gold pages that turn t showed;
- `recall_cumulative[t]`: the share of the gold pages shown by turn t (turns 1..t together);
- `recall`: the last cumulative value, the episode's recall (0 for an episode that showed none);
- `ndcg`: the reward's retrieval part (`core.reward.retrieval_score`): binary-relevance NDCG of
  the distinct pages in the order first shown, ideal DCG over all gold pages, as VRAG-RL's
  retrieval reward ranks the retrieved images against the golden ones (arXiv 2505.22019, the
  retrieval-efficiency reward);
- `gold`: how many gold pages the question has.

A page counts as (document, page): page 3 of another document is not gold. A question without
gold pages (an unanswerable one) has no retrieval metrics: None.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..core.reward import parse_ground_truth, ranked_pages, retrieval_score


def gold_pages(truth: Any) -> set:
    """The gold (document, page) pairs of a parsed ground truth (`core.reward.GroundTruth`); gold
    page numbers without any document named are matched by number alone, as the reward matches
    them (`None` stands for any document: see `_shown`)."""
    return {page if isinstance(page, tuple) else (truth.doc_id, page) for page in truth.gold_pages}


def _shown(pages: Sequence[str], truth: Any) -> set:
    """The (document, page) pairs a turn showed, the document dropped where the truth names none."""
    shown = set(ranked_pages([pages]))
    if truth.doc_id is None and any(not isinstance(page, tuple) for page in truth.gold_pages):
        shown |= {(None, page) for _, page in shown}
    return shown


def retrieval_metrics(turn_page_ids: Sequence[Sequence[str]], ground_truth: Any) -> Optional[dict]:
    """The episode's retrieval metrics (module docstring), or None without gold pages."""
    truth = parse_ground_truth(ground_truth)
    gold = gold_pages(truth)
    if not gold:
        return None
    per_turn, cumulative, seen = [], [], set()
    for pages in turn_page_ids:
        shown = _shown(pages, truth) & gold
        seen |= shown
        per_turn.append(len(shown) / len(gold))
        cumulative.append(len(seen) / len(gold))
    shown_truth = type(truth)(truth.answer, truth.doc_id, truth.gold_pages,
                              tuple(tuple(pages) for pages in turn_page_ids))
    return {"recall": cumulative[-1] if cumulative else 0.0, "recall_per_turn": per_turn,
            "recall_cumulative": cumulative, "ndcg": retrieval_score(shown_truth), "gold": len(gold)}
