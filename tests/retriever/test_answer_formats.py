"""The two answer formats against the real server: the rollout client asks for MessagePack and
gets each image as its JPEG bytes; a JSON client gets the same pages as base64; both decode to
the same page. Oracle: the JSON answer (ALDEN's format), read independently."""

from __future__ import annotations

import base64

import pytest

from retriever_server import contract
from retriever_server.api.testing import serve_in_thread
from retriever_server.sample_corpus import SAMPLE_FACTS
from vrag_rollout.retrieval.blocking import HttpTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.transport import RawAnswer, TransportMalformed, decode_answer
from vrag_rollout.retrieval.types import FetchSpec, RetrievedPage, RetrieverFailure
from vrag_rollout.core.vision import PixelBand, decode_page, decode_page_file

BAND = PixelBand(4 * 28 * 28, 64 * 28 * 28)


@pytest.fixture(scope="module")
def base_url(sample_index):
    with serve_in_thread(sample_index) as url:
        yield url


def _results(url: str, binary: bool):
    queries = list(SAMPLE_FACTS)
    doc_ids = [doc for doc, _ in SAMPLE_FACTS.values()]
    specs = [FetchSpec("image", 1), FetchSpec("text", 1), FetchSpec("image", 999)]
    transport = HttpTransport(url, binary=binary)
    with RetrieverClient(url, transport=transport) as client:
        return (client.batch_search(queries, doc_ids, top_n=2),
                client.batch_fetch(specs, [doc_ids[0]] * 3))


@pytest.mark.process
def test_server_answers_msgpack_only_when_asked(base_url):
    body = {"query": ["image, 1"], "id": [next(iter(SAMPLE_FACTS.values()))[0]]}
    packed = HttpTransport(base_url).send("/batch_fetch", body, 10)
    plain = HttpTransport(base_url, binary=False).send("/batch_fetch", body, 10)
    assert contract.is_msgpack(packed.content_type) and plain.content_type == contract.JSON
    assert len(packed.data) < 0.8 * len(plain.data)  # no base64: about a quarter smaller
    assert isinstance(decode_answer(packed)[0]["contents"], bytes)


@pytest.mark.process
def test_binary_and_json_answers_carry_the_same_pages(base_url):
    (search_b, fetch_b), (search_j, fetch_j) = _results(base_url, True), _results(base_url, False)
    pages_b = [p for hits in search_b for p in hits] + fetch_b[:2]
    pages_j = [p for hits in search_j for p in hits] + fetch_j[:2]
    assert all(isinstance(p, RetrievedPage) for p in pages_b + pages_j) and len(pages_b) > 6
    for b, j in zip(pages_b, pages_j, strict=True):
        assert (b.page_id, b.page, b.modality) == (j.page_id, j.page, j.modality)
        if b.modality == "text":
            assert isinstance(b.contents, str) and b.contents == j.contents
            continue
        assert isinstance(b.contents, bytes) and isinstance(j.contents, str)
        assert b.contents == base64.b64decode(j.contents, validate=True)
        page_b, page_j = decode_page_file(b.contents, BAND), decode_page(j.contents, BAND)
        assert page_b.grid_thw == page_j.grid_thw
        assert page_b.image.tobytes() == page_j.image.tobytes()
    # A page past the end is the same request mistake in both.
    assert fetch_b[2] == fetch_j[2] and isinstance(fetch_b[2], RetrieverFailure)
    assert fetch_b[2].kind == "request"
    # Every search found its fact's page first, in both formats.
    assert [hits[0].page_id for hits in search_b] == [f"{d}_{p}" for d, p in SAMPLE_FACTS.values()]


@pytest.mark.parametrize("answer, what", [
    (RawAnswer(b"\xc1", "application/msgpack"), "not MessagePack"),
    (RawAnswer(b'[{"id": "x"}]', "application/msgpack"), "not MessagePack"),
    (RawAnswer(b"\x91\x81", "application/x-msgpack; charset=binary"), "not MessagePack"),
    (RawAnswer(b"\x91\xc0", None), "not JSON"),
])
def test_a_body_that_is_not_what_it_claims_is_malformed(answer, what):
    with pytest.raises(TransportMalformed, match=what):
        decode_answer(answer)
