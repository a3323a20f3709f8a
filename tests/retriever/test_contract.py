"""The wire contract's forms, and the server speaking them (error codes say whose mistake)."""

from __future__ import annotations

import pytest

from retriever_server import contract


@pytest.mark.parametrize("text, parsed", [
    ("image, 3", ("image", 3)), ("text,12", ("text", 12)), (" IMAGE ,  7 ", ("image", 7)), ("3-th", ("image", 3)),
    ("image, 0", ("image", 0)),  # range is the server's to judge
    ("image 3", None), ("picture, 3", None), ("image, -1", None), ("", None), (None, None),
])
def test_fetch_specs(text, parsed):
    assert contract.parse_fetch_spec(text) == parsed
    if parsed:
        assert contract.parse_fetch_spec(contract.fetch_spec(*parsed)) == parsed


def test_page_ids_round_trip_with_underscores_in_the_doc():
    assert contract.page_id("annual_report_2024", 3) == "annual_report_2024_3"
    assert contract.parse_page_id("annual_report_2024_3") == ("annual_report_2024", 3)
    assert contract.parse_page_id("no-page") is None


def test_the_server_labels_its_error_items(client):
    doc = "annual_report"
    answers = client.post("/batch_fetch", json={"query": ["image, 999", "picture", "image, 1"],
                                                "id": [doc, doc, "no_such_doc"]}).json()
    assert [a.get("code") for a in answers] == [contract.PAGE_OUT_OF_RANGE, contract.MALFORMED_FETCH,
                                                contract.UNKNOWN_DOCUMENT]
    assert all(a["id"] == contract.ERROR_ID for a in answers)
    searched = client.post("/batch_search", json={"query": [" ", "anything"], "id": [doc, "no_such_doc"], "top_n": 1}).json()
    assert [hits[0].get("code") for hits in searched] == [contract.MALFORMED_QUERY, contract.UNKNOWN_DOCUMENT]
