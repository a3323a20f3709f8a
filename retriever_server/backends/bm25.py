"""The embedded default backend: page-aware BM25 (bm25s) over page text, searched in any scope.

Two BM25 matrices cover the whole corpus (so IDF statistics come from all pages): one over page
text, one over each page's heading lines (``retriever_server.indexing.headings``). A query is scored
against every page and only its scope is ranked: its document's contiguous row range, the rows
of a subset of documents, or every row for a corpus search (``top_rows``: O(rows) selection,
ties by row, i.e. by (document order, page)). Pages are scored by

    score(page) = role_weight[role(page)] * (bm25_text + w(query) * bm25_headings)

(``page_aware_scores``). Contents and index pages repeat section titles word for word, so their
weight is below 1: they still rank when nothing else matches (a positive score beats zero), but
no longer above the section itself. ``w(query)`` is ``heading_weight`` for queries of up to
``heading_query_tokens`` content words and shrinks in proportion beyond that
(``heading_weight_for``): a heading names a section in a few words, while a long query is a
passage, for which the page text is the evidence (a full heading weight on sentence-long queries
cost 3-5 points of R@1 on body sentences in the evaluation). The weights are recorded in the manifest at index time;
indexes built before roles existed (no ``ranking`` in the manifest) rank as plain BM25.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from ..storage.store import PageStore
from .base import Hit, Scope, StoreBackend, open_whole

SUBDIR = "bm25"
HEADINGS_SUBDIR = "bm25_headings"
TOKENIZER = {"pattern": r"(?u)\b\w\w+\b", "lowercase": True, "stopwords": "en"}
_TOKEN_RE = re.compile(TOKENIZER["pattern"])
_STOPWORDS = frozenset(STOPWORDS_EN)

# Tuned on the development manuals of scripts/eval_retrieval.py (gnuplot, R-intro, R-admin,
# asymptote); the held-out manuals there were not used to choose them.
# Front matter keeps weight 1: questions about a copyright or licence notice must still find it.
PAGE_AWARE = {"heading_weight": 1.0, "heading_query_tokens": 6,
              "role_weights": {"body": 1.0, "front": 1.0, "contents": 0.2, "index": 0.2}}
PLAIN = {"heading_weight": 0.0, "heading_query_tokens": 0, "role_weights": {}}


def tokenize(text: str) -> list[str]:
    """The one tokenizer used for pages, headings and queries."""
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


def _write(texts: list[str], path: Path) -> None:
    retriever = bm25s.BM25()
    # bm25s needs at least one token overall; a corpus of blank scans still gets a valid index.
    corpus = [tokenize(t) for t in texts]
    if not any(corpus):
        corpus[0] = ["__empty__"]
    retriever.index(corpus, show_progress=False)
    retriever.save(str(path))


def build(pages, index_dir: Path, ranking: Mapping | None = None) -> dict:
    """Write the BM25 indexes of ``pages`` (manifest ``PageEntry``s, corpus order); manifest info.

    ``ranking`` (default ``PAGE_AWARE``) is recorded for the backend to apply at search time.
    """
    _write([p.text for p in pages], Path(index_dir) / SUBDIR)
    _write(["\n".join(p.headings) for p in pages], Path(index_dir) / HEADINGS_SUBDIR)
    return {"kind": "bm25", "dir": SUBDIR, "headings_dir": HEADINGS_SUBDIR, "tokenizer": TOKENIZER,
            "bm25s": bm25s.__version__, "ranking": dict(ranking or PAGE_AWARE)}


def page_aware_scores(text: np.ndarray, headings: np.ndarray | None, row_weights: np.ndarray,
                      heading_weight: float) -> np.ndarray:
    """Combine the two BM25 fields and the per-row role weights (pure)."""
    combined = text if headings is None or heading_weight == 0 else text + heading_weight * headings
    return combined * row_weights


def heading_weight_for(num_tokens: int, weight: float, full_until: int) -> float:
    """The heading field's weight for a query of ``num_tokens`` content words (pure)."""
    if num_tokens <= full_until:
        return weight
    return weight * full_until / num_tokens


def row_weights(roles: list[str], role_weights: Mapping[str, float]) -> np.ndarray:
    """Per-row multipliers from page roles; roles without a weight count 1."""
    return np.array([float(role_weights.get(r, 1.0)) for r in roles], dtype=np.float32)


def rank_rows(scores: np.ndarray, start: int, stop: int, top_n: int) -> list[tuple[int, float]]:
    """Top ``top_n`` (row, score) in [start, stop), score descending, ties by row (pure)."""
    window = scores[start:stop]
    k = min(top_n, len(window))
    # Stable sort on the negated scores keeps page order among equal scores.
    order = np.argsort(-window, kind="stable")[:k]
    return [(start + int(i), float(window[i])) for i in order]


def top_rows(scores: np.ndarray, top_n: int, rows: np.ndarray | None = None
             ) -> list[tuple[int, float]]:
    """Top ``top_n`` (row, score) among ``rows`` (ascending; None: every row), score
    descending, ties by row (pure): the order of ``rank_rows``, in O(rows) rather than a full
    sort. ``argpartition`` finds the k-th best score; the rows above it and the first rows equal
    to it are the top k, and only those are sorted."""
    window = scores if rows is None else scores[rows]
    k = min(top_n, len(window))
    if k < len(window):
        threshold = window[np.argpartition(-window, k - 1)[k - 1]]
        above = np.flatnonzero(window > threshold)
        at = np.flatnonzero(window == threshold)[:k - len(above)]
        chosen = np.sort(np.concatenate([above, at]))  # row order, for the stable sort below
    else:
        chosen = np.arange(k)
    chosen = chosen[np.argsort(-window[chosen], kind="stable")]
    return [(int(i) if rows is None else int(rows[i]), float(window[i])) for i in chosen]


class Bm25Backend(StoreBackend):
    name = "bm25"

    def __init__(self, store: PageStore, retriever: bm25s.BM25,
                 headings: bm25s.BM25 | None = None, ranking: Mapping | None = None):
        self.store = store
        self._bm25 = retriever
        self._headings = headings
        self._num_rows = len(store.manifest.pages)
        self.ranking = dict(ranking if ranking is not None else PLAIN)
        self._heading_weight = float(self.ranking.get("heading_weight", 0.0))
        self._heading_tokens = int(self.ranking.get("heading_query_tokens", 0))
        self._row_weights = row_weights([p.role for p in store.manifest.pages],
                                        self.ranking.get("role_weights", {}))

    @classmethod
    def from_store(cls, store: PageStore, ranking: Mapping | None = None) -> "Bm25Backend":
        """Open the BM25 part of an index; ``ranking`` overrides the manifest's (e.g. ``PLAIN``)."""
        info = store.manifest.backend
        sub = info.get("dir", SUBDIR)
        if sub != SUBDIR:
            raise ValueError(f"unexpected bm25 directory {sub!r} in manifest")
        retriever = bm25s.BM25.load(str(store.root / SUBDIR), mmap=False)
        headings = None
        if info.get("headings_dir") == HEADINGS_SUBDIR:
            headings = bm25s.BM25.load(str(store.root / HEADINGS_SUBDIR), mmap=False)
        if ranking is None:
            ranking = info.get("ranking", PLAIN)
        return cls(store, retriever, headings, ranking)

    @classmethod
    def open(cls, index_dir, ranking: Mapping | None = None) -> "Bm25Backend":
        return open_whole(index_dir, lambda store: cls.from_store(store, ranking))

    def documents(self) -> Mapping[str, int]:
        return self.store.documents()

    @staticmethod
    def _field_scores(retriever: bm25s.BM25, tokens: list[str], rows: int) -> np.ndarray:
        ids = retriever.get_tokens_ids(tokens)
        if not ids:
            return np.zeros(rows, dtype=np.float32)
        return retriever.get_scores_from_ids(ids)

    def scores(self, query: str) -> np.ndarray:
        """Page-aware scores of ``query`` against every row of the corpus."""
        tokens = tokenize(query)
        text = self._field_scores(self._bm25, tokens, self._num_rows)
        weight = heading_weight_for(len(tokens), self._heading_weight, self._heading_tokens)
        headings = None
        if self._headings is not None and weight:
            headings = self._field_scores(self._headings, tokens, self._num_rows)
        return page_aware_scores(text, headings, self._row_weights, weight)

    def _subset_rows(self, doc_ids) -> np.ndarray:
        """Rows of the documents ``doc_ids``, ascending (index order)."""
        ranges = sorted(self.store.doc_rows(d) for d in doc_ids)
        return np.concatenate([np.arange(start, stop) for start, stop in ranges])

    def _hit_at(self, row: int, score: float) -> Hit:
        entry = self.store.entry_at(row)
        return Hit(entry.doc_id, row - self.store.doc_rows(entry.doc_id)[0] + 1, score)

    def search(self, queries: list[str], doc_ids: list[Scope], top_n: int) -> list[list[Hit]]:
        if len(queries) != len(doc_ids):
            raise ValueError("queries and doc_ids differ in length")
        results = []
        for query, doc_id in zip(queries, doc_ids, strict=True):
            if isinstance(doc_id, str):  # one document: its contiguous row range
                start, stop = self.store.doc_rows(doc_id)
                ranked = rank_rows(self.scores(query), start, stop, top_n)
                results.append([Hit(doc_id, row - start + 1, score) for row, score in ranked])
                continue
            rows = None if doc_id is None else self._subset_rows(doc_id)
            results.append([self._hit_at(row, score)
                            for row, score in top_rows(self.scores(query), top_n, rows)])
        return results

