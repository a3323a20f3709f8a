"""The Qdrant backend in local mode: MaxSim ranking against a brute-force oracle, the per-document
filter, persistence across reopening and moving the index, and the unchanged wire format."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from fastapi.testclient import TestClient

from retriever_server.api.app import create_app
from retriever_server.backends import open_backend
from retriever_server.backends.qdrant import QdrantBackend
from retriever_server.encoders.base import maxsim
from retriever_server.storage.store import PageStore

from .dense_support import dense_index

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)

QUERIES = ["lockout tagout padlock", "board approved the Lisbon expansion", "firmware update"]
DOCS = ["safety_manual", "annual_report", "product_guide"]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return dense_index(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def backend(index):
    b = open_backend(index)
    yield b
    b.close()


def test_dense_index_opens_as_qdrant(backend):
    assert isinstance(backend, QdrantBackend)


def test_ranking_matches_brute_force_maxsim(backend, index):
    store = PageStore.open(index)
    encoder = backend.encoder
    for query, doc_id in zip(QUERIES[1:], DOCS[1:], strict=True):  # 8 pages: keep it quick
        q = encoder.encode_queries([query])[0]
        count = store.documents()[doc_id]
        pages = encoder.encode_images([store.page_image(doc_id, p).jpeg for p in range(1, count + 1)])
        # Oracle: numpy MaxSim over every page of the document, best first.
        expected = sorted(((maxsim(q, v), p) for p, v in enumerate(pages, start=1)),
                          key=lambda sp: (-sp[0], sp[1]))
        hits = backend.search([query], [doc_id], count)[0]
        assert [h.page for h in hits] == [p for _, p in expected]
        np.testing.assert_allclose([h.score for h in hits], [s for s, _ in expected], rtol=1e-4)


def test_each_query_is_filtered_to_its_document(backend):
    hits = backend.search(QUERIES, DOCS, 50)
    for doc_id, found in zip(DOCS, hits, strict=True):
        assert {h.doc_id for h in found} == {doc_id}
        # top_n above the page count gives every page of the document once.
        assert sorted(h.page for h in found) == list(range(1, len(found) + 1))
    assert [len(h) for h in hits] == [5, 4, 4]
    assert [len(h) for h in backend.search(QUERIES, DOCS, 2)] == [2, 2, 2]


def test_results_persist_across_reopening_and_moving(backend, index, tmp_path):
    before = backend.search(QUERIES, DOCS, 3)
    moved = shutil.copytree(index, tmp_path / "moved")
    again = open_backend(moved)
    try:
        assert again.search(QUERIES, DOCS, 3) == before
    finally:
        again.close()


def test_wire_format_is_unchanged(index, tmp_path):
    copy = shutil.copytree(index, tmp_path / "served")  # local mode: one client per folder
    with TestClient(create_app(copy)) as client:
        answer = client.post("/batch_search", json={"query": QUERIES[:2], "id": DOCS[:2],
                                                    "top_n": 2, "return_score": True}).json()
        fetched = client.post("/batch_fetch", json={"query": ["text, 2"], "id": ["safety_manual"]})
    assert [len(hits) for hits in answer] == [2, 2]
    hit = answer[0][0]
    assert hit["id"] == f"{hit['doc_id']}_{hit['page']}" and hit["doc_id"] == "safety_manual"
    assert hit["mime"] == "image/jpeg" and isinstance(hit["score"], float)
    assert hit["contents"].startswith("/9j/")  # standard base64 of a JPEG
    assert "Lockout" in fetched.json()[0]["contents"]
