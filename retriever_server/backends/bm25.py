"""The embedded default backend: BM25 (bm25s) over page text, searched per document.

One BM25 matrix covers the whole corpus (so IDF statistics come from all pages); a query is
scored against every page and only its document's contiguous row range is ranked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from ..store import PageImage, PageStore
from .base import Backend, Hit

SUBDIR = "bm25"
TOKENIZER = {"pattern": r"(?u)\b\w\w+\b", "lowercase": True, "stopwords": "en"}
_TOKEN_RE = re.compile(TOKENIZER["pattern"])
_STOPWORDS = frozenset(STOPWORDS_EN)


def tokenize(text: str) -> list[str]:
    """The one tokenizer used for both pages and queries."""
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


def build(texts: list[str], index_dir: Path) -> dict:
    """Write the BM25 index of ``texts`` (corpus order) under ``index_dir``; manifest info back."""
    retriever = bm25s.BM25()
    # bm25s needs at least one token overall; a corpus of blank scans still gets a valid index.
    corpus = [tokenize(t) for t in texts]
    if not any(corpus):
        corpus[0] = ["__empty__"]
    retriever.index(corpus, show_progress=False)
    retriever.save(str(Path(index_dir) / SUBDIR))
    return {"kind": "bm25", "dir": SUBDIR, "tokenizer": TOKENIZER, "bm25s": bm25s.__version__}


def rank_rows(scores: np.ndarray, start: int, stop: int, top_n: int) -> list[tuple[int, float]]:
    """Top ``top_n`` (row, score) in [start, stop), score descending, ties by row (pure)."""
    window = scores[start:stop]
    k = min(top_n, len(window))
    # Stable sort on the negated scores keeps page order among equal scores.
    order = np.argsort(-window, kind="stable")[:k]
    return [(start + int(i), float(window[i])) for i in order]


class Bm25Backend(Backend):
    name = "bm25"

    def __init__(self, store: PageStore, retriever: bm25s.BM25):
        self.store = store
        self._bm25 = retriever
        self._num_rows = len(store.manifest.pages)

    @classmethod
    def from_store(cls, store: PageStore) -> "Bm25Backend":
        sub = store.manifest.backend.get("dir", SUBDIR)
        if sub != SUBDIR:
            raise ValueError(f"unexpected bm25 directory {sub!r} in manifest")
        retriever = bm25s.BM25.load(str(store.root / SUBDIR), mmap=False)
        return cls(store, retriever)

    @classmethod
    def open(cls, index_dir) -> "Bm25Backend":
        return cls.from_store(PageStore.open(index_dir))

    def documents(self) -> Mapping[str, int]:
        return self.store.documents()

    def _scores(self, query: str) -> np.ndarray:
        ids = self._bm25.get_tokens_ids(tokenize(query))
        if not ids:
            return np.zeros(self._num_rows, dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)

    def search(self, queries: list[str], doc_ids: list[str], top_n: int) -> list[list[Hit]]:
        if len(queries) != len(doc_ids):
            raise ValueError("queries and doc_ids differ in length")
        results = []
        for query, doc_id in zip(queries, doc_ids, strict=True):
            start, stop = self.store.doc_rows(doc_id)
            ranked = rank_rows(self._scores(query), start, stop, top_n)
            results.append([Hit(doc_id, row - start + 1, score) for row, score in ranked])
        return results

    def page_image(self, doc_id: str, page: int) -> PageImage:
        return self.store.page_image(doc_id, page)

    def page_text(self, doc_id: str, page: int) -> str:
        return self.store.page_text(doc_id, page)
