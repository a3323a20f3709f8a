"""Hybrid search: reciprocal-rank fusion (RRF) of a lexical and a dense backend.

    rrf(page) = sum over rankings r containing the page of 1 / (k + rank_r(page))

with 1-based ranks and ``k = 60`` (Cormack et al., 2009). RRF needs no score calibration between
BM25 and MaxSim, whose scales differ. Each backend contributes its top ``depth`` pages of the
query's scope (a document, a subset of documents or the whole corpus); pages are fused on
(doc_id, page), so a corpus search fuses across documents. The fused list is cut to ``top_n``,
ties broken by (document's place in the index, page). Pages, text and page
info come from the lexical backend (both read the same ``PageStore``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from ..storage.store import PageImage, PageStore
from .base import Backend, Hit, Scope, doc_order_key

RRF_K = 60
MIN_DEPTH = 50


def rrf(rankings: Sequence[Sequence[Hashable]], k: float = RRF_K) -> dict[Hashable, float]:
    """Fused score of every item appearing in ``rankings`` (each best first) (pure)."""
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores


class HybridBackend(Backend):
    name = "hybrid"

    def __init__(self, lexical: Backend, dense: Backend, k: int = RRF_K, depth: int = MIN_DEPTH):
        self.lexical, self.dense, self.k, self.depth = lexical, dense, k, depth

    @property
    def store(self) -> PageStore | None:
        """The index's ``PageStore`` (the lexical half's; ``open_backend`` gives both halves the
        same one): the server identifies and versions the index by it, as for one backend."""
        return getattr(self.lexical, "store", None)

    def documents(self) -> Mapping[str, int]:
        return self.lexical.documents()

    def search(self, queries: list[str], doc_ids: list[Scope], top_n: int) -> list[list[Hit]]:
        depth = max(top_n, self.depth)
        lexical = self.lexical.search(queries, doc_ids, depth)
        dense = self.dense.search(queries, doc_ids, depth)
        key = doc_order_key(self.documents())
        results = []
        for lex, den in zip(lexical, dense, strict=True):
            fused = rrf([[(h.doc_id, h.page) for h in lex], [(h.doc_id, h.page) for h in den]],
                        self.k)
            hits = [Hit(doc_id, page, score) for (doc_id, page), score in fused.items()]
            results.append(sorted(hits, key=key)[:top_n])
        return results

    def page_info(self, doc_id: str, page: int) -> Mapping[str, object]:
        return self.lexical.page_info(doc_id, page)

    def page_image(self, doc_id: str, page: int) -> PageImage:
        return self.lexical.page_image(doc_id, page)

    def image_sizes(self, doc_id: str) -> Sequence[int] | None:
        return self.lexical.image_sizes(doc_id)

    def source_pdf(self, doc_id: str) -> bytes | None:
        return self.lexical.source_pdf(doc_id)

    def page_text(self, doc_id: str, page: int) -> str:
        return self.lexical.page_text(doc_id, page)

    def close(self) -> None:
        self.lexical.close()
        self.dense.close()
