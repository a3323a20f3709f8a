"""Corpus-scope search: ``id`` absent/null (the whole index) or a list of doc ids (a subset).

Rankings are checked against an oracle independent of the corpus path: every document searched
on its own (the per-document path, unchanged) and the hits merged by score, ties by (document
order, page); for Qdrant, brute-force MaxSim over every page; for hybrid, RRF written out over
its two halves' corpus rankings. Also: mixed scopes in one batch, error items of bad subsets,
the answer-size bound of corpus and subset searches, and doc-scoped answers byte for byte.
"""

from __future__ import annotations

import json
import shutil

import msgpack
import numpy as np
import pytest
from fastapi.testclient import TestClient

from retriever_server import contract
from retriever_server.api.app import create_app
from retriever_server.backends.bm25 import Bm25Backend, rank_rows, top_rows
from retriever_server.encoders.base import maxsim
from retriever_server.serving import answer_size, wire
from retriever_server.serving.limits import Limits
from retriever_server.storage.store import PageStore

from .dense_support import dense_index, opened_copy

DOCS = ["annual_report", "safety_manual", "product_guide"]  # index order
# Words on pages of two or three documents, so a corpus search mixes them.
QUERIES = ["lockout padlock revenue EBITDA", "firmware reset evacuation muster",
           "solar panels thermostat energy", "zzz no such words"]


def oracle(backend, query: str, docs, top_n: int) -> list[tuple[str, int, float]]:
    """Each document of ``docs`` searched alone (all its pages), merged best first."""
    counts = backend.documents()
    hits = [h for d in docs for h in backend.search([query], [d], counts[d])[0]]
    order = {d: i for i, d in enumerate(counts)}
    hits.sort(key=lambda h: (-h.score, order[h.doc_id], h.page))
    return [(h.doc_id, h.page, h.score) for h in hits[:top_n]]


def triples(hits) -> list[tuple[str, int, float]]:
    return [(h.doc_id, h.page, h.score) for h in hits]


@pytest.fixture(scope="module")
def bm25(sample_index):
    backend = Bm25Backend.open(sample_index)
    yield backend
    backend.close()


# -- BM25 ranking ----------------------------------------------------------------------------

def test_top_rows_orders_like_a_full_sort():
    rng = np.random.default_rng(0)
    for _ in range(500):
        scores = rng.integers(0, 4, rng.integers(1, 40)).astype(np.float32)  # many ties
        top_n = int(rng.integers(1, 45))
        assert top_rows(scores, top_n) == rank_rows(scores, 0, len(scores), top_n)
        rows = np.sort(rng.choice(len(scores), rng.integers(1, len(scores) + 1), replace=False))
        expected = sorted(((int(r), float(scores[r])) for r in rows),
                          key=lambda rs: (-rs[1], rs[0]))
        assert top_rows(scores, top_n, rows) == expected[:top_n]


@pytest.mark.parametrize("top_n", [1, 3, 10, 13, 50])
def test_bm25_corpus_search_equals_merged_per_document_searches(bm25, top_n):
    found = bm25.search(QUERIES, [None] * len(QUERIES), top_n)
    for query, hits in zip(QUERIES, found, strict=True):
        assert triples(hits) == oracle(bm25, query, DOCS, top_n)
    # Hits from several documents, best first.
    assert len({h.doc_id for h in found[0][:3]}) >= min(top_n, 2)
    assert [h.score for h in found[0]] == sorted((h.score for h in found[0]), reverse=True)


def test_bm25_corpus_scores_are_bm25s_scores(bm25):
    # A second oracle: the page-aware scores of every row, straight from the backend's scorer.
    scores = bm25.scores(QUERIES[0])
    best = sorted(range(len(scores)), key=lambda r: (-scores[r], r))[:5]
    store = bm25.store
    expected = [(store.entry_at(r).doc_id, store.entry_at(r).page, float(scores[r])) for r in best]
    assert triples(bm25.search([QUERIES[0]], [None], 5)[0]) == expected


@pytest.mark.parametrize("subset", [frozenset({"safety_manual"}),
                                    frozenset({"product_guide", "annual_report"}), tuple(DOCS)])
def test_bm25_subset_search_ranks_only_the_subset(bm25, subset):
    for query, hits in zip(QUERIES, bm25.search(QUERIES, [subset] * len(QUERIES), 50),
                           strict=True):
        assert {h.doc_id for h in hits} <= set(subset)
        assert len(hits) == sum(bm25.documents()[d] for d in subset)  # every page, once
        assert triples(hits) == oracle(bm25, query, [d for d in DOCS if d in subset], 50)


# -- HTTP ------------------------------------------------------------------------------------

def post(client, body, path="/batch_search"):
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_corpus_search_over_http_absent_or_null_id(client, bm25):
    body = {"query": QUERIES[:3], "top_n": 4, "return_score": True}
    absent = post(client, body)
    assert post(client, {**body, "id": None}) == absent
    assert post(client, {**body, "id": [None, None, None]}) == absent
    for query, items in zip(QUERIES, absent, strict=False):
        expected = oracle(bm25, query, DOCS, 4)
        assert [(i["doc_id"], i["page"]) for i in items] == [(d, p) for d, p, _ in expected]
        assert all(i["id"] == contract.page_id(i["doc_id"], i["page"]) for i in items)
        assert [i["score"] for i in items] == pytest.approx([s for _, _, s in expected])
    single = post(client, {"query": QUERIES[0], "top_n": 4, "return_score": True}, "/search")
    assert single == absent[0]
    assert post(client, {"query": QUERIES[0], "id": None, "top_n": 4, "return_score": True},
                "/search") == single


def test_subset_search_over_http(client):
    subset = ["product_guide", "safety_manual"]
    items = post(client, {"query": ["padlock firmware revenue"], "id": [subset], "top_n": 50})[0]
    assert {i["doc_id"] for i in items} == set(subset) and len(items) == 9
    single = post(client, {"query": "padlock firmware revenue", "id": subset, "top_n": 50},
                  "/search")
    assert single == items


def test_mixed_scopes_in_one_batch(client):
    queries = ["padlock evacuation", "revenue thermostat", "firmware padlock", "solar"]
    ids = ["safety_manual", None, ["product_guide", "annual_report"], "annual_report"]
    mixed = post(client, {"query": queries, "id": ids, "top_n": 3, "return_score": True})
    for query, scope, items in zip(queries, ids, mixed, strict=True):
        alone = post(client, {"query": [query], "id": [scope], "top_n": 3, "return_score": True})
        assert items == alone[0]
    assert {i["doc_id"] for i in mixed[0]} == {"safety_manual"}
    assert {i["doc_id"] for i in mixed[2]} <= {"product_guide", "annual_report"}


def test_bad_subsets_are_error_items(client):
    answer = post(client, {"query": ["padlock"] * 4,
                           "id": [["safety_manual", "nope"], [], None, "safety_manual"]})
    unknown, empty, corpus, doc = answer
    assert unknown[0]["id"] == "error" and unknown[0]["code"] == contract.UNKNOWN_DOCUMENT
    assert "'nope'" in unknown[0]["contents"]
    assert empty[0]["id"] == "error" and empty[0]["code"] == contract.MALFORMED_QUERY
    assert "at least one" in empty[0]["contents"] and "null" in empty[0]["contents"]
    assert corpus[0]["id"] == doc[0]["id"] == "safety_manual_2"
    single = post(client, {"query": "padlock", "id": []}, "/search")
    assert single[0]["code"] == contract.MALFORMED_QUERY


def test_id_list_of_wrong_length_is_422(client):
    r = client.post("/batch_search", json={"query": ["a", "b"], "id": [None]})
    assert r.status_code == 422 and "'query' has 2 items but 'id' has 1" in r.json()["detail"]


def test_doc_scoped_answer_bytes_are_the_per_document_path(app, client, bm25):
    """A doc-scoped answer is exactly the per-document ranking (``rank_rows`` over the
    document's rows) rendered: the path is untouched by corpus scope."""
    service = app.state.index.current.service
    queries, ids = ["padlock", "revenue", "firmware reset"], ["safety_manual", "annual_report",
                                                               "product_guide"]
    for form in (contract.JSON, contract.MSGPACK):
        r = client.post("/batch_search", json={"query": queries, "id": ids, "top_n": 3,
                                               "return_score": True}, headers={"accept": form})
        tree = []
        for query, doc_id in zip(queries, ids, strict=True):
            start, stop = bm25.store.doc_rows(doc_id)
            ranked = rank_rows(bm25.scores(query), start, stop, 3)
            tree.append([wire.HitItem(service.cache.get(doc_id, row - start + 1, form), score)
                         for row, score in ranked])
        assert r.content == wire.render(tree, form)
    answer = msgpack.unpackb(r.content)
    assert [[i["id"] for i in items] for items in answer] == [
        ["safety_manual_2", "safety_manual_1", "safety_manual_3"],
        ["annual_report_2", "annual_report_1", "annual_report_3"],
        ["product_guide_4", "product_guide_1", "product_guide_2"]]


# -- answer size -----------------------------------------------------------------------------

def test_budget_bounds_corpus_and_subset_by_their_largest_pages(sample_index):
    store = PageStore.open(sample_index)
    budget = answer_size.AnswerBudget(Bm25Backend.from_store(store), 10**9)
    sizes = {d: store.image_sizes(d) for d in DOCS}
    every = sorted((s for d in DOCS for s in sizes[d]), reverse=True)
    assert budget._scope_bound(None, 3) == (sum(every[:3]), 3)
    assert budget._scope_bound(None, 50) == (sum(every), 13)
    pair = sorted(sizes["safety_manual"] + sizes["product_guide"], reverse=True)
    pair_scope = frozenset({"safety_manual", "product_guide"})
    assert budget._scope_bound(pair_scope, 6) == (sum(pair[:6]), 6)
    assert budget._scope_bound("safety_manual", 3) == (sum(sorted(sizes["safety_manual"])[-3:]), 3)


def test_answer_size_limit_refuses_an_oversized_corpus_search(sample_index):
    store = PageStore.open(sample_index)
    pages = [s for d in DOCS for s in store.image_sizes(d)]
    corpus_bound = (4 * sum(pages) + 8 * len(pages)) // 3 + len(pages) * answer_size.ITEM_ALLOWANCE
    small = TestClient(create_app(sample_index, limits=Limits(max_answer_bytes=corpus_bound - 1)))
    r = small.post("/batch_search", json={"query": ["padlock"], "top_n": 13})
    assert r.status_code == 413 and "13 page images" in r.json()["detail"]
    # Each document alone, and a subset of two, fit under the same limit.
    assert small.post("/batch_search", json={"query": ["padlock"], "id": "safety_manual",
                                             "top_n": 13}).status_code == 200
    assert small.post("/search", json={"query": "padlock", "id": ["safety_manual", "annual_report"],
                                       "top_n": 13}).status_code == 200
    assert small.post("/search", json={"query": "padlock", "top_n": 12}).status_code == 200


# -- dense and hybrid ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    with opened_copy(tmp_path_factory.getbasetemp(), "dense-corpus-scope") as backend:
        yield backend


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    with opened_copy(tmp_path_factory.getbasetemp(), "hybrid-corpus-scope", search="hybrid") as backend:
        yield backend


@pytest.mark.process
def test_qdrant_corpus_and_subset_search_equal_brute_force_maxsim(dense):
    store, encoder = dense.store, dense.encoder
    page_vectors = {(d, p): v for d in DOCS for p, v in enumerate(encoder.encode_images(
        [store.page_image(d, p).jpeg for p in range(1, store.documents()[d] + 1)]), start=1)}
    for query in QUERIES[:2]:
        q = encoder.encode_queries([query])[0]
        scored = sorted(((maxsim(q, v), DOCS.index(d), d, p) for (d, p), v in page_vectors.items()),
                        key=lambda s: (-s[0], s[1], s[3]))
        pair = frozenset({"safety_manual", "product_guide"})
        for scope, top_n in [(None, 13), (None, 4), (pair, 9)]:
            expected = [s for s in scored if scope is None or s[2] in scope][:top_n]
            hits = dense.search([query], [scope], top_n)[0]
            assert [(h.doc_id, h.page) for h in hits] == [(d, p) for _, _, d, p in expected]
            np.testing.assert_allclose([h.score for h in hits], [s[0] for s in expected], rtol=1e-4)
    assert len({h.doc_id for h in dense.search([QUERIES[0]], [None], 13)[0]}) == 3


@pytest.mark.process
def test_hybrid_corpus_search_fuses_across_documents(hybrid):
    for query in QUERIES:
        lexical = [(h.doc_id, h.page) for h in hybrid.lexical.search([query], [None], 13)[0]]
        dense = [(h.doc_id, h.page) for h in hybrid.dense.search([query], [None], 13)[0]]
        # Oracle: RRF written out on (doc, page) keys, ties by (document order, page).
        fused = {key: 1 / (60 + lexical.index(key) + 1) + 1 / (60 + dense.index(key) + 1)
                 for key in lexical}
        order = sorted(fused, key=lambda k: (-fused[k], DOCS.index(k[0]), k[1]))
        hits = hybrid.search([query], [None], 5)[0]
        assert [(h.doc_id, h.page) for h in hits] == order[:5]
        assert [h.score for h in hits] == pytest.approx([fused[k] for k in order[:5]])
    assert len({h.doc_id for h in hybrid.search([QUERIES[0]], [None], 13)[0]}) == 3
    subset = frozenset({"annual_report", "product_guide"})
    assert {h.doc_id for h in hybrid.search([QUERIES[2]], [subset], 13)[0]} == set(subset)


@pytest.mark.process
def test_hybrid_corpus_search_over_http(hybrid, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    index = shutil.copytree(dense_index(base, search="hybrid"), base / "hybrid-corpus-http")
    with TestClient(create_app(index)) as client:
        answer = json.loads(client.post("/batch_search", json={
            "query": QUERIES[:2], "id": [None, ["safety_manual"]], "top_n": 3}).content)
    assert [(i["doc_id"], i["page"]) for i in answer[0]] == [
        (h.doc_id, h.page) for h in hybrid.search([QUERIES[0]], [None], 3)[0]]
    assert {i["doc_id"] for i in answer[1]} == {"safety_manual"}
