"""Page-level retrieval metrics of one ranked list (pure).

Contract: `ranked` is a retriever's answer to one question, best first, as (document, page)
pairs; `gold` the question's gold (document, page) pairs. A page counts once, at its first
place (a repeat is dropped before cutting at k). Binary relevance: a page is gold or not.

- `recall_at_k(ranked, gold, k)` = |gold ∩ top k| / |gold|.
- `ndcg_at_k(ranked, gold, k)` = DCG@k / IDCG@k with DCG@k = sum over the places i = 1..k holding
  a gold page of 1 / log2(i + 1), and IDCG@k the DCG@k of a list that puts every gold page first
  (sum over i = 1..min(k, |gold|) of 1 / log2(i + 1)): the trec_eval `ndcg_cut` definition with
  relevance 0 or 1 (gain = relevance, discount log2(rank + 1)).
- `mmdocir_page_recall(ranked, gold, k)`: MMDocIR's page-level Recall@k (Dong et al. 2025,
  arXiv 2501.08828, "MMDocIR: Benchmarking Multi-Modal Retrieval for Long Documents": the share of
  a question's gold pages among the top k pages the retriever ranks inside the question's own
  document; reported at k = 1, 3, 5). Scored in document scope only: the pages ranked are the
  question's document's.
- `vidore_ndcg_at_10(ranked, gold)`: ViDoRe's main score (Faysse et al. 2024, arXiv 2407.01449,
  "ColPali"; github.com/illuin-tech/vidore-benchmark scores runs with MTEB's retrieval evaluator,
  i.e. pytrec_eval's `ndcg_cut.10` over binary qrels): nDCG@10 as above, over the whole page
  pool of the benchmark (corpus scope).
All return None for a question without gold pages (not 0: it has nothing to find).
"""

from __future__ import annotations

import math
from typing import Hashable, Optional, Sequence

MMDOCIR_KS = (1, 3, 5)
VIDORE_K = 10


def _distinct(ranked: Sequence[Hashable]) -> list:
    return list(dict.fromkeys(ranked))


def recall_at_k(ranked: Sequence[Hashable], gold: set, k: int) -> Optional[float]:
    if not gold:
        return None
    return len(set(_distinct(ranked)[:k]) & set(gold)) / len(gold)


def ndcg_at_k(ranked: Sequence[Hashable], gold: set, k: int) -> Optional[float]:
    if not gold:
        return None
    dcg = sum(1 / math.log2(i + 1) for i, page in enumerate(_distinct(ranked)[:k], start=1) if page in gold)
    ideal = sum(1 / math.log2(i + 1) for i in range(1, min(k, len(gold)) + 1))
    return dcg / ideal


def mmdocir_page_recall(ranked: Sequence[Hashable], gold: set, k: int) -> Optional[float]:
    return recall_at_k(ranked, gold, k)


def vidore_ndcg_at_10(ranked: Sequence[Hashable], gold: set) -> Optional[float]:
    return ndcg_at_k(ranked, gold, VIDORE_K)
