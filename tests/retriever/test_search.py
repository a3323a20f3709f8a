import numpy as np
import pytest

from retriever_server.backends import open_backend
from retriever_server.backends.bm25 import rank_rows, tokenize
from retriever_server.sample_corpus import SAMPLE_FACTS


@pytest.fixture(scope="module")
def backend(sample_index):
    return open_backend(sample_index)


@pytest.mark.parametrize("query", list(SAMPLE_FACTS))
def test_sample_fact_is_rank_one(backend, query):
    doc_id, page = SAMPLE_FACTS[query]
    hits = backend.search([query], [doc_id], 3)[0]
    assert (hits[0].doc_id, hits[0].page) == (doc_id, page)
    assert hits[0].score > hits[1].score


def test_each_query_stays_inside_its_document(backend):
    # The Lisbon query matches only the annual report; asked of the safety manual it must still
    # return safety-manual pages (all scoring zero, in page order).
    hits = backend.search(["board approved the Lisbon expansion"] * 2,
                          ["annual_report", "safety_manual"], 5)
    assert {h.doc_id for h in hits[0]} == {"annual_report"}
    assert [(h.doc_id, h.page, h.score) for h in hits[1]] == [
        ("safety_manual", p, 0.0) for p in range(1, 6)]


def test_top_n_is_capped_by_document_length(backend):
    hits = backend.search(["firmware"], ["product_guide"], 50)[0]
    assert sorted(h.page for h in hits) == [1, 2, 3, 4]


def test_rank_rows_orders_by_score_then_row():
    scores = np.array([9.0, 1.0, 3.0, 3.0, 0.0, 7.0], dtype=np.float32)
    assert rank_rows(scores, 1, 5, 3) == [(2, 3.0), (3, 3.0), (1, 1.0)]
    assert rank_rows(scores, 0, 6, 10)[0] == (0, 9.0)


def test_tokenizer_lowercases_and_drops_stopwords():
    assert tokenize("The C-wire and the E42 ERROR") == ["wire", "e42", "error"]
