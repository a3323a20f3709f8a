import base64
import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from retriever_server.api.app import create_app
from retriever_server.sample_corpus import SAMPLE_FACTS
from retriever_server.serving.limits import Limits
from retriever_server.storage.store import PageStore


def _jpeg(b64: str) -> Image.Image:
    raw = base64.b64decode(b64, validate=True)  # standard alphabet, strictly
    image = Image.open(io.BytesIO(raw))
    image.load()
    assert image.format == "JPEG"
    return image


def _errors(items):
    return [item["contents"] for item in items if item["id"] == "error"]


def test_batch_search_wire_format(client, sample_index):
    queries = list(SAMPLE_FACTS)
    body = {"query": queries, "id": [SAMPLE_FACTS[q][0] for q in queries], "top_n": 3,
            "return_score": True}
    r = client.post("/batch_search", json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    results = r.json()
    assert len(results) == len(queries)
    store = PageStore.open(sample_index)
    for query, hits in zip(queries, results):
        doc_id, page = SAMPLE_FACTS[query]
        assert len(hits) == 3
        assert hits[0]["id"] == f"{doc_id}_{page}"  # 1-based page ids
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
        for hit in hits:
            assert hit["id"] == f"{hit['doc_id']}_{hit['page']}" and hit["mime"] == "image/jpeg"
            image = _jpeg(hit["contents"])
            entry = store.entry(hit["doc_id"], hit["page"])
            assert image.size == (entry.width, entry.height)


def test_scores_only_when_asked(client):
    r = client.post("/batch_search", json={"query": ["padlock"], "id": ["safety_manual"], "top_n": 1})
    assert "score" not in r.json()[0][0]


def test_alden_client_fields_are_accepted(client):
    body = {"query": ["E42"], "id": ["product_guide"], "top_n": 1, "return_score": False,
            "recall_ocr": False, "mm_fetch": False}
    hits = client.post("/batch_search", json=body).json()
    assert hits[0][0]["id"] == "product_guide_4"


def test_single_id_string_applies_to_all_queries(client):
    hits = client.post("/batch_search", json={"query": ["padlock", "muster"], "id": "safety_manual",
                                              "top_n": 1}).json()
    assert [h[0]["id"] for h in hits] == ["safety_manual_2", "safety_manual_4"]


def test_bad_items_do_not_abort_the_batch(client):
    long_query = "turbine " * 400
    body = {"query": ["lockout tagout padlock", "", "   ", long_query, "padlock", "E42"],
            "id": ["safety_manual", "safety_manual", "annual_report", "annual_report",
                   "no_such_doc", "../../etc/passwd"],
            "top_n": 2}
    r = client.post("/batch_search", json=body)
    assert r.status_code == 200
    results = r.json()
    assert results[0][0]["id"] == "safety_manual_2"
    for i, needle in [(1, "empty query"), (2, "empty query"), (3, "limit is 2000"),
                      (4, "unknown document id 'no_such_doc'"), (5, "unknown document id")]:
        assert len(results[i]) == 1 and results[i][0]["id"] == "error"
        assert needle in results[i][0]["contents"]


def test_batch_fetch_image_text_and_alden_nth(client, sample_index):
    store = PageStore.open(sample_index)
    body = {"query": ["image, 3", "text, 2", "3-th", "IMAGE ,1"], "id": ["annual_report"] * 4}
    items = client.post("/batch_fetch", json=body).json()
    assert [i["id"] for i in items] == ["image, 3", "text, 2", "image, 3", "image, 1"]
    entry = store.entry("annual_report", 3)
    assert _jpeg(items[0]["contents"]).size == (entry.width, entry.height)
    assert items[1]["contents"] == store.page_text("annual_report", 2)
    assert "EBITDA margin" in items[1]["contents"]
    assert items[2]["contents"] == items[0]["contents"]


def test_batch_fetch_bad_items(client):
    specs = ["image, 0", "image, 6", "text, 99999999999", "picture, 2", "image 2", "", "text, -1",
             "image, 2", "image, 2"]
    ids = ["safety_manual"] * 7 + ["missing", "safety_manual"]
    items = client.post("/batch_fetch", json={"query": specs, "id": ids}).json()
    reasons = _errors(items[:8])
    assert len(reasons) == 8
    assert "page 0 is out of range" in reasons[0] and "pages 1..5" in reasons[0]
    assert "page 6 is out of range" in reasons[1]
    for reason in reasons[2:7]:
        assert "cannot read fetch request" in reason
    assert "unknown document id" in reasons[7]
    assert items[8]["id"] == "image, 2"  # the good item after the bad ones is answered


def test_search_endpoint(client):
    r = client.post("/search", json={"query": "assembly point muster", "id": "safety_manual",
                                     "top_n": 2, "return_score": True})
    hits = r.json()
    assert hits[0]["id"] == "safety_manual_4" and "score" in hits[0]
    r = client.post("/search", json={"query": "muster", "id": "nope", "top_n": 2})
    assert r.status_code == 200 and r.json()[0]["id"] == "error"


def test_health_and_documents(client):
    assert client.get("/health").json() == {"status": "healthy", "backend": "bm25",
                                            "documents": 3, "pages": 13}
    docs = client.get("/documents").json()["documents"]
    assert docs == [{"doc_id": "annual_report", "num_pages": 4},
                    {"doc_id": "safety_manual", "num_pages": 5},
                    {"doc_id": "product_guide", "num_pages": 4}]


@pytest.mark.parametrize("body, needle", [
    ({}, "Field required"),
    ({"query": "padlock", "id": ["safety_manual"]}, "valid list"),
    ({"query": [1, 2], "id": ["a", "b"]}, "valid string"),
    ({"query": ["a", "b"], "id": ["safety_manual"]}, "'query' has 2 items but 'id' has 1"),
    ({"query": ["a"], "id": ["safety_manual"], "top_n": 0}, "top_n must be between 1 and 50"),
    ({"query": ["a"], "id": ["safety_manual"], "top_n": 51}, "top_n must be between 1 and 50"),
    ({"query": ["a"], "id": ["safety_manual"], "top_n": "many"}, "valid integer"),
    ({"query": ["a"] * 1025, "id": "safety_manual"}, "over the limit of 1024"),
])
def test_malformed_requests_are_422_with_a_message(client, body, needle):
    r = client.post("/batch_search", json=body)
    assert r.status_code == 422
    assert needle in r.json()["detail"]


def test_malformed_fetch_and_json_are_422(client):
    assert client.post("/batch_fetch", json={"query": ["image, 1"]}).status_code == 422
    assert client.post("/batch_fetch", json={"query": ["image, 1"] * 3, "id": ["a"] * 2}).status_code == 422
    r = client.post("/batch_search", content=b'{"query": [', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["detail"]


def test_empty_batch_is_an_empty_answer(client):
    assert client.post("/batch_search", json={"query": [], "id": []}).json() == []


def test_oversized_body_is_413(sample_index):
    small = TestClient(create_app(sample_index, limits=Limits(max_body_bytes=1000)))
    r = small.post("/batch_search", json={"query": ["x" * 2000], "id": ["safety_manual"]})
    assert r.status_code == 413


def test_api_key(sample_index):
    c = TestClient(create_app(sample_index, api_key="s3cret"))
    body = {"query": ["padlock"], "id": ["safety_manual"], "top_n": 1}
    assert c.post("/batch_search", json=body).status_code == 401
    assert c.post("/batch_search", json=body, headers={"X-API-Key": "wrong"}).status_code == 401
    assert c.get("/documents").status_code == 401
    ok = c.post("/batch_search", json=body, headers={"X-API-Key": "s3cret"})
    assert ok.status_code == 200 and ok.json()[0][0]["id"] == "safety_manual_2"
    assert c.get("/health").status_code == 200


def test_urlsafe_decoding_clients_get_the_same_bytes(client):
    # ALDEN's client decodes with urlsafe_b64decode; standard base64 must decode identically.
    hit = client.post("/batch_search", json={"query": ["chart"], "id": ["annual_report"],
                                             "top_n": 1}).json()[0][0]
    assert "-" not in hit["contents"] and "_" not in hit["contents"]
    assert base64.urlsafe_b64decode(hit["contents"]) == base64.b64decode(hit["contents"])


def test_single_fetch_endpoint(client):
    items = client.post("/fetch", json={"query": "text, 1", "id": "product_guide"}).json()
    assert items[0]["id"] == "text, 1" and "HX-300" in items[0]["contents"]
    items = client.post("/fetch", json={"query": "image, 9", "id": "product_guide"}).json()
    assert items[0]["id"] == "error" and "pages 1..4" in items[0]["contents"]


def test_json_body_without_content_type_header_is_accepted(client):
    r = client.post("/batch_search", content=b'{"query": ["E42"], "id": ["product_guide"], "top_n": 1}')
    assert "content-type" not in r.request.headers
    assert r.status_code == 200 and r.json()[0][0]["id"] == "product_guide_4"
