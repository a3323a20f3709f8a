"""Pure pieces: wire fragments, fetch-spec parsing, the fragment cache, a custom backend."""

import base64
import io
import json

import msgpack
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from retriever_server import contract
from retriever_server.api.app import create_app
from retriever_server.backends.base import Backend, Hit
from retriever_server.serving import wire
from retriever_server.serving.cache import FragmentCache
from retriever_server.serving.limits import Limits, parse_fetch_spec, query_problem
from retriever_server.storage.store import PageImage


def _tiny_jpeg(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (28, 28), (shade, shade, shade)).save(buf, format="JPEG")
    return buf.getvalue()


class MemoryBackend(Backend):
    """A minimal custom backend: proves the app needs nothing beyond the interface."""

    name = "memory"

    def __init__(self, pages: dict[str, list[str]], broken: frozenset[str] = frozenset()):
        self.pages, self.broken, self.reads = pages, broken, 0

    def documents(self):
        return {d: len(p) for d, p in self.pages.items()}

    def search(self, queries, doc_ids, top_n):
        if any(d in self.broken for d in doc_ids):
            raise RuntimeError("engine failure")
        out = []
        for query, doc_id in zip(queries, doc_ids, strict=True):
            scored = [(float(text.count(query)), n) for n, text in enumerate(self.pages[doc_id], 1)]
            scored.sort(key=lambda s: (-s[0], s[1]))
            out.append([Hit(doc_id, n, score) for score, n in scored[:top_n]])
        return out

    def page_image(self, doc_id, page):
        self.reads += 1
        return PageImage(_tiny_jpeg(page * 20), 28, 28)

    def page_text(self, doc_id, page):
        return self.pages[doc_id][page - 1]


_EXTRA = st.dictionaries(st.sampled_from(["role", "headings"]),
                         st.one_of(st.text(max_size=8), st.lists(st.text(max_size=8), max_size=3)))


def _answer_tree(doc_id, page, score, extra, form):
    jpeg = b"\xff\xd8jpeg bytes " + doc_id.encode()
    fragment = wire.make_fragment(doc_id, page, jpeg, extra=extra, form=form)
    return jpeg, [[wire.HitItem(fragment, score)],
                  [wire.ImageFetch("image, 1", fragment), wire.text_item("text, 1", "words", page=1)],
                  [wire.error_item("no such page", "page_out_of_range")]]


@given(st.text(max_size=30), st.integers(1, 10**6),
       st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)), _EXTRA)
def test_both_formats_carry_the_same_values(doc_id, page, score, extra):
    # Oracles: the standard library's JSON parser and the msgpack package (not the encoder used).
    jpeg, tree = _answer_tree(doc_id, page, score, extra, contract.JSON)
    as_json = json.loads(wire.render(tree, contract.JSON))
    _, tree = _answer_tree(doc_id, page, score, extra, contract.MSGPACK)
    as_msgpack = msgpack.unpackb(wire.render(tree, contract.MSGPACK), raw=False)
    hit = as_json[0][0]
    assert hit["id"] == f"{doc_id}_{page}" and hit["doc_id"] == doc_id and hit["page"] == page
    assert ("score" in hit) == (score is not None)
    assert base64.b64decode(hit["contents"], validate=True) == jpeg
    assert as_msgpack[0][0]["contents"] == jpeg and isinstance(as_msgpack[1][0]["contents"], bytes)
    for item in (as_msgpack[0][0], as_msgpack[1][0]):  # images: bytes here, base64 in JSON
        item["contents"] = base64.b64encode(item["contents"]).decode()
    assert as_msgpack == as_json


def test_non_finite_scores_are_written_as_zero():
    for form, load in ((contract.JSON, json.loads), (contract.MSGPACK, msgpack.unpackb)):
        fragment = wire.make_fragment("d", 1, b"x", form=form)
        assert load(wire.render([wire.HitItem(fragment, float("nan"))], form))[0]["score"] == 0.0


@pytest.mark.parametrize("accept, msgpack_wanted", [
    (None, False), ("", False), ("application/json", False), ("*/*", False),
    ("application/msgpack", True), ("application/x-msgpack", True),
    ("application/vnd.msgpack", True), ("Application/MsgPack; q=1", True),
    ("application/msgpack, application/json;q=0.9", True),
    ("application/json, application/msgpack;q=0.5", False),
    ("application/msgpack;q=0, */*", False), ("application/msgpack;q=oops", False),
    ("text/html, application/msgpack", True),
])
def test_accept_negotiation(accept, msgpack_wanted):
    assert contract.prefers_msgpack(accept) is msgpack_wanted


@given(st.sampled_from(["image", "text", "IMAGE", "Text"]), st.integers(0, 10**9 - 1),
       st.sampled_from([",", " ,", ", ", " , "]))
def test_fetch_specs_round_trip(modality, page, comma):
    assert parse_fetch_spec(f"{modality}{comma}{page}") == (modality.lower(), page)
    assert parse_fetch_spec(f"{page}-th") == ("image", page)


@given(st.text(max_size=40))
def test_parse_fetch_spec_never_raises(spec):
    result = parse_fetch_spec(spec)
    assert result is None or (result[0] in ("image", "text") and result[1] >= 0)


def test_query_problems():
    limits = Limits(max_query_chars=10)
    assert query_problem("ok query", limits) is None
    assert "empty" in query_problem(" \t\n", limits)
    assert "11 characters" in query_problem("x" * 11, limits)


def test_cache_evicts_least_recently_used_and_reuses_hits():
    backend = MemoryBackend({"d": ["a", "b", "c"]})
    one = wire.make_fragment("d", 1, backend.page_image("d", 1).jpeg).nbytes
    backend.reads = 0
    cache = FragmentCache(backend, max_bytes=2 * one + one // 2)  # room for two pages
    cache.get("d", 1, contract.JSON)
    cache.get("d", 2, contract.JSON)
    cache.get("d", 1, contract.JSON)  # hit; page 1 is now most recent
    assert backend.reads == 2
    cache.get("d", 3, contract.JSON)  # evicts page 2
    cache.get("d", 1, contract.JSON)
    assert backend.reads == 3
    cache.get("d", 2, contract.JSON)
    assert backend.reads == 4
    assert cache.nbytes <= 2 * one + one // 2


def test_cache_keeps_the_form_asked_for_and_counts_a_second_one():
    backend = MemoryBackend({"d": ["a", "b"]})
    jpeg = backend.page_image("d", 1).jpeg
    cache = FragmentCache(backend)
    fragment = cache.get("d", 1, contract.MSGPACK)
    assert fragment.jpeg == jpeg and fragment.b64 is None
    only_jpeg = cache.nbytes
    assert cache.get("d", 1, contract.JSON) is fragment  # the same page gains its base64
    assert base64.b64decode(fragment.b64) == jpeg
    assert cache.nbytes == only_jpeg + len(fragment.b64) == fragment.nbytes
    json_first = cache.get("d", 2, contract.JSON)
    assert json_first.jpeg is None and cache.get("d", 2, contract.MSGPACK).jpeg == backend.page_image("d", 2).jpeg
    assert cache.nbytes == fragment.nbytes + json_first.nbytes
    assert backend.reads == 4  # two reads above + one per page into the cache


@pytest.mark.parametrize("first, second", [(contract.MSGPACK, contract.JSON), (contract.JSON, contract.MSGPACK)])
def test_a_form_derived_in_the_cache_renders_the_same_answer(first, second):
    # Oracle: the answer rendered from a fragment made directly in that form.
    backend = MemoryBackend({"d": ["a"]})
    image = backend.page_image("d", 1)
    cache = FragmentCache(backend)
    cache.get("d", 1, first)
    derived = cache.get("d", 1, second)
    direct = wire.make_fragment("d", 1, image.jpeg, image.mime, form=second)
    for fragment in (derived, direct):
        assert fragment.has(second)
    render = lambda f: wire.render([[wire.HitItem(f, 0.5)], [wire.ImageFetch("image, 1", f)]], second)  # noqa: E731
    assert render(derived) == render(direct)


def test_cache_bytes_stay_the_sum_of_its_pages_when_a_page_is_evicted_while_gaining_a_form(monkeypatch):
    backend = MemoryBackend({"d": ["a", "b", "c"]})
    one = wire.make_fragment("d", 1, backend.page_image("d", 1).jpeg, form=contract.MSGPACK).nbytes
    cache = FragmentCache(backend, max_bytes=2 * one + one // 2)  # room for two pages in one form
    page1 = cache.get("d", 1, contract.MSGPACK)
    cache.get("d", 2, contract.MSGPACK)
    derive = wire.PageFragment.derive

    def derive_while_evicted(self, form):
        if self is page1:
            cache.get("d", 3, contract.MSGPACK)  # evicts page 1 meanwhile (it is the oldest)
        return derive(self, form)

    monkeypatch.setattr(wire.PageFragment, "derive", derive_while_evicted)
    assert cache.get("d", 1, contract.JSON).has(contract.JSON)  # served, though evicted
    held = cache._items.values()
    assert page1 not in held and cache.nbytes == sum(f.nbytes for f in held) <= 2 * one + one // 2


def test_render_refuses_a_page_without_the_form_asked_for():
    fragment = wire.make_fragment("d", 1, b"\xff\xd8", form=contract.JSON)
    with pytest.raises(ValueError, match="not held in the form"):
        wire.render([wire.HitItem(fragment)], contract.MSGPACK)
    with pytest.raises(ValueError, match="unknown answer form"):
        wire.render([], "text/html")


def test_custom_backend_is_a_drop_in_and_failures_stay_per_item():
    backend = MemoryBackend({"good": ["red apple", "green pear", "red red cherry"],
                             "flaky": ["anything"]}, broken=frozenset({"flaky"}))
    client = TestClient(create_app(backend))
    body = {"query": ["red", "pear", "x"], "id": ["good", "good", "flaky"], "top_n": 2,
            "return_score": True}
    results = client.post("/batch_search", json=body).json()
    assert [h["id"] for h in results[0]] == ["good_3", "good_1"]
    assert results[0][0]["score"] == 2.0
    assert results[1][0]["id"] == "good_2"
    assert results[2] == [{"id": "error", "contents": "search failed: RuntimeError", "code": "unreadable"}]
    fetched = client.post("/batch_fetch", json={"query": ["text, 2"], "id": "good"}).json()
    assert fetched[0]["contents"] == "green pear"
    # The same answer in MessagePack when Accept prefers it: images as their JPEG bytes.
    for path, req in (("/batch_search", body), ("/batch_fetch", {"query": ["text, 2", "image, 1"], "id": "good"})):
        as_json = client.post(path, json=req)
        packed = client.post(path, json=req, headers={"Accept": "application/msgpack, application/json;q=0.5"})
        assert packed.headers["content-type"] == "application/msgpack"
        assert as_json.headers["content-type"] == "application/json" and packed.headers["vary"] == "Accept"
        items = msgpack.unpackb(packed.content)
        for item in (i for group in items for i in (group if isinstance(group, list) else [group])):
            if isinstance(item["contents"], bytes):
                assert Image.open(io.BytesIO(item["contents"])).format == "JPEG"
                item["contents"] = base64.b64encode(item["contents"]).decode()
        assert items == as_json.json()
    assert client.get("/health").json()["backend"] == "memory"


def test_needs_ocr_threshold():
    from retriever_server.indexing.ocr import MIN_TEXT_CHARS, needs_ocr

    assert needs_ocr("") and needs_ocr(" \n" * 50 + "x" * (MIN_TEXT_CHARS - 1))
    assert not needs_ocr("y" * MIN_TEXT_CHARS) and not needs_ocr("word " * 1000)


def test_render_excess_is_trimmed_evenly():
    from retriever_server.indexing.ingest import _center_crop

    image = Image.new("RGB", (30, 40), "white")
    image.paste((255, 0, 0), (0, 0, 30, 3))  # a 3-px red band at the top
    cropped = _center_crop(image, (28, 34))
    assert cropped.size == (28, 34)
    assert cropped.getpixel((0, 0)) == (255, 255, 255)  # the band was in the trimmed 3 px
    assert _center_crop(image, (56, 56)).size == (30, 40)  # too small: left to the resampler


@pytest.mark.parametrize("value, preload", [("0", False), ("", False), ("1", "json"), ("json", "json"),
                                            ("msgpack", "msgpack")])
def test_preload_setting_from_the_environment(value, preload):
    from retriever_server.api.asgi import _preload_from_env

    assert _preload_from_env(value) == preload


def test_an_unknown_preload_setting_is_an_error():
    from retriever_server.api.asgi import _preload_from_env

    with pytest.raises(ValueError, match="VRAG_RETRIEVER_PRELOAD"):
        _preload_from_env("MSGPACK")
