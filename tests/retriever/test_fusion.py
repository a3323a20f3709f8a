"""Reciprocal-rank fusion: the formula on hand-made rankings, and the hybrid backend against RRF
computed from its two real backends' own rankings."""

from __future__ import annotations


import pytest

from retriever_server.backends.bm25 import Bm25Backend
from retriever_server.backends.fusion import HybridBackend, rrf
from retriever_server.backends.qdrant import QdrantBackend
from retriever_server.storage.store import PageStore

from .dense_support import opened_copy


def test_rrf_on_hand_made_rankings():
    fused = rrf([["a", "b", "c"], ["c", "a"]], k=60)
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["b"] == pytest.approx(1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert sorted(fused, key=lambda x: -fused[x]) == ["a", "c", "b"]


def test_rrf_k_sets_how_much_the_top_ranks_dominate():
    # One list has x first, the other has y second and x last of five.
    rankings = [["x", "y", "p", "q", "r"], ["s", "y", "t", "u", "x"]]
    small, large = rrf(rankings, k=0.5), rrf(rankings, k=1000)
    assert small["x"] > small["y"]  # with a small k, a single first place wins
    assert large["y"] > large["x"]  # with a large k, appearing high in both lists wins


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    with opened_copy(tmp_path_factory.getbasetemp(), "hybrid-copy", search="hybrid") as backend:
        yield backend


@pytest.mark.process
def test_hybrid_index_opens_as_fusion_of_bm25_and_qdrant(hybrid):
    assert isinstance(hybrid, HybridBackend)
    assert isinstance(hybrid.lexical, Bm25Backend) and isinstance(hybrid.dense, QdrantBackend)


@pytest.mark.parametrize("query,doc_id", [("lockout tagout padlock", "safety_manual"),
                                          ("quarterly revenue", "annual_report"),
                                          ("zzz unknown words", "product_guide")])
@pytest.mark.process
def test_hybrid_equals_rrf_of_its_parts(hybrid, query, doc_id):
    n = PageStore.documents(hybrid.lexical.store)[doc_id]
    lexical = [h.page for h in hybrid.lexical.search([query], [doc_id], n)[0]]
    dense = [h.page for h in hybrid.dense.search([query], [doc_id], n)[0]]
    # Oracle: the formula written out, independent of rrf().
    expected = {p: 1 / (60 + lexical.index(p) + 1) + 1 / (60 + dense.index(p) + 1) for p in lexical}
    order = sorted(expected, key=lambda p: (-expected[p], p))
    hits = hybrid.search([query], [doc_id], 3)[0]
    assert [h.page for h in hits] == order[:3]
    assert [h.score for h in hits] == pytest.approx([expected[p] for p in order[:3]])
