"""/metrics: Prometheus text that a Prometheus parser reads, with the numbers the issue asks for."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from retriever_server.api.app import create_app


def _samples(client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_count_requests_latency_and_describe_the_index(sample_index):
    client = TestClient(create_app(sample_index))
    before = _samples(client)
    for _ in range(3):
        assert client.post("/batch_search", json={"query": ["padlock"], "id": ["safety_manual"],
                                                  "top_n": 1}).status_code == 200
    assert client.post("/batch_search", json={"query": "not a list"}).status_code == 422
    client.get("/health")
    after = _samples(client)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("vrag_retriever_requests_total", route="/batch_search", code="200") == 3
    assert delta("vrag_retriever_requests_total", route="/batch_search", code="422") == 1
    assert delta("vrag_retriever_requests_total", route="/health", code="200") == 1
    assert delta("vrag_retriever_request_duration_seconds_count", route="/batch_search") == 4
    assert delta("vrag_retriever_request_duration_seconds_sum", route="/batch_search") > 0
    assert after[("vrag_retriever_queue_depth", ())] == 0
    assert after[("vrag_retriever_in_flight", ())] == 0
    assert after[("vrag_retriever_index_pages", ())] == 13
    assert after[("vrag_retriever_index_documents", ())] == 3
    info = [labels for (name, labels), value in after.items()
            if name == "vrag_retriever_index_info" and value == 1]
    assert len(info) == 1
    version = dict(info[0])["version"]
    assert dict(info[0])["backend"] == "bm25" and dict(info[0])["path"] == str(sample_index)
    served = client.post("/batch_fetch", json={"query": ["text, 1"], "id": ["annual_report"]})
    assert served.headers["X-Index-Version"] == version


def test_reload_counts_a_load_and_unknown_paths_share_one_label(sample_index):
    client = TestClient(create_app(sample_index))
    assert client.post("/admin/reload").status_code == 200
    for path in ("/nope", "/nope/2", "/x"):
        assert client.get(path).status_code == 404
    samples = _samples(client)
    assert samples[("vrag_retriever_index_loads_total", ())] == 2
    assert samples[("vrag_retriever_requests_total", (("code", "404"), ("route", "other")))] == 3
