"""RetrieverClient against a real HTTP server on 127.0.0.1 that can be told to misbehave."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrag_rollout.retrieval import transport as transport_module
from vrag_rollout.retrieval.blocking import HttpTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.congestion import AdaptiveLimit, ReplicaSet, parse_urls
from vrag_rollout.retrieval.transport import (
    TransportConnectionError,
    TransportHTTPError,
    TransportTimeout,
    tries_text,
)
from vrag_rollout.retrieval.types import FetchSpec, RetrievedPage, RetrieverFailure
from vrag_rollout.retrieval.wire import MalformedResponse, parse_fetch_results, parse_search_results

DOCS = {"annual_report": 5, "manual_v2": 3}


def page_b64(doc: str, page: int) -> str:
    return base64.b64encode(f"jpeg:{doc}:{page}".encode()).decode()


def wire_answer(path: str, body: dict):
    """A correct retriever: what the real server would say (the retriever-api wire format)."""
    if path == "/batch_search":
        out = []
        for query, doc in zip(body["query"], body["id"]):
            if query == "boom" or doc not in DOCS:
                out.append([{"id": "error", "contents": f"cannot search {doc!r}"}])
                continue
            n = DOCS[doc]
            pages = [(len(query) + k) % n + 1 for k in range(min(body["top_n"], n))]
            out.append([{"id": f"{doc}_{p}", "contents": page_b64(doc, p)} for p in pages])
        return out
    if path == "/batch_fetch":
        out = []
        for spec, doc in zip(body["query"], body["id"]):
            modality, page = spec.split(", ")
            page = int(page)
            if doc not in DOCS or page > DOCS[doc]:
                out.append({"id": "error", "contents": f"page {page} out of range for {doc}"})
            elif modality == "text":
                out.append({"id": spec, "contents": f"text of {doc} page {page}"})
            else:
                out.append({"id": spec, "contents": page_b64(doc, page)})
        return out
    if path == "/batch_crop":
        out = []
        for doc, page, box in zip(body["id"], body["page"], body["box"]):
            if doc not in DOCS or page > DOCS[doc]:
                out.append({"id": "error", "contents": f"page {page} out of range for {doc}", "code": "page_out_of_range"})
            else:
                out.append({"id": f"{doc}_{page}", "contents": crop_b64(doc, page, box)})
        return out
    return None


def crop_b64(doc: str, page: int, box) -> str:
    return base64.b64encode(f"crop:{doc}:{page}:{box}".encode()).decode()


class FakeRetriever:
    """Threaded HTTP server. `script` holds actions for the next requests, first first; when it is
    empty requests get the correct wire answer. Actions: ("status", code), ("raw", bytes),
    ("json", obj), ("hang",) (sleeps until released, past any client timeout), ("refuse", s)
    (503 with `Retry-After: s`, as admission control answers), ("refuse_ms", ms) (the same with
    `Retry-After: 0` and `Retry-After-Ms: ms`, as this project's server answers). `keepalive`:
    HTTP/1.1 connections kept open between requests (else one connection per request)."""

    def __init__(self, delay: float = 0.0, keepalive: bool = False):
        self.script: list[tuple] = []
        self.delay = delay
        self.requests: list[tuple[str, dict, dict]] = []  # (path, headers, body)
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: list[tuple[str, int]] = []  # (action, requests in flight on arrival)
        self.peers: list[int] = []  # the client's port, per request: which connection it came on
        self.lock = threading.Lock()
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keepalive else "HTTP/1.0"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                self._reply(200, b'{"status": "ok"}') if self.path == "/health" else self._reply(404, b"{}")

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                with fake.lock:
                    fake.requests.append((self.path, dict(self.headers), body))
                    fake.peers.append(self.client_address[1])
                    action = fake.script.pop(0) if fake.script else None
                    fake.in_flight += 1
                    self.counted = True
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    fake.arrivals.append((action[0] if action else "answer", fake.in_flight))
                try:
                    if fake.delay:
                        time.sleep(fake.delay)
                    if action is None:
                        self._reply(200, json.dumps(wire_answer(self.path, body)).encode())
                    elif action[0] == "hang":
                        fake.release.wait(10)
                        self._reply(200, json.dumps(wire_answer(self.path, body)).encode())
                    elif action[0] == "status":
                        self._reply(action[1], b'{"detail": "injected"}')
                    elif action[0] == "raw":
                        self._reply(200, action[1])
                    elif action[0] == "json":
                        self._reply(200, json.dumps(action[1]).encode())
                    elif action[0] == "refuse":
                        self._reply(503, b'{"detail": "overloaded"}', {"Retry-After": str(action[1])})
                    elif action[0] == "refuse_ms":
                        self._reply(503, b'{"detail": "overloaded"}',
                                    {"Retry-After": "0", "Retry-After-Ms": str(action[1])})
                finally:
                    self._leave()

            def _leave(self):
                # Out of flight before the answer is written: once the client reads it, it may
                # send its next request, which must not find this one still counted.
                with fake.lock:
                    if getattr(self, "counted", False):
                        fake.in_flight -= 1
                        self.counted = False

            def _reply(self, code: int, data: bytes, headers: dict | None = None):
                self._leave()
                try:
                    self.send_response(code)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): expected in these tests

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def paths(self) -> Counter:
        return Counter(p for p, _, _ in self.requests)

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeRetriever()
    yield server
    server.stop()


def client_for(fake: FakeRetriever, **kw) -> RetrieverClient:
    kw.setdefault("timeout", 2.0)
    kw.setdefault("backoff", 0.0)
    return RetrieverClient(fake.url, **kw)


# --------------------------------------------------------------------------- happy path


@pytest.mark.process
def test_search_and_fetch_happy_path(fake):
    with client_for(fake) as client:
        res = client.batch_search(["revenue", "boom", "safety"], ["annual_report", "annual_report", "manual_v2"], top_n=2)
        assert len(res) == 3
        first = res[0]
        assert isinstance(first, list) and len(first) == 2
        for hit in first:
            assert isinstance(hit, RetrievedPage)
            assert hit.doc_id == "annual_report" and hit.modality == "image"
            assert hit.page_id == f"annual_report_{hit.page}"
            assert base64.b64decode(hit.contents) == f"jpeg:annual_report:{hit.page}".encode()
        # one query erroring fails that query only
        assert res[1] == RetrieverFailure("server", "cannot search 'annual_report'")
        assert isinstance(res[2], list) and all(h.doc_id == "manual_v2" for h in res[2])

        specs = [FetchSpec("image", 3), FetchSpec("text", 2), FetchSpec("image", 9)]
        got = client.batch_fetch(specs, ["annual_report", "manual_v2", "manual_v2"])
        assert got[0] == RetrievedPage("annual_report_3", "annual_report", 3, "image", page_b64("annual_report", 3))
        assert got[1] == RetrievedPage("manual_v2_2", "manual_v2", 2, "text", "text of manual_v2 page 2")
        assert got[2] == RetrieverFailure("server", "page 9 out of range for manual_v2")
        assert client.health()

    path, headers, body = fake.requests[0]
    assert path == "/batch_search"
    assert body == {"query": ["revenue", "boom", "safety"], "id": ["annual_report", "annual_report", "manual_v2"], "top_n": 2, "return_score": False}
    assert fake.requests[1][2] == {"query": ["image, 3", "text, 2", "image, 9"], "id": ["annual_report", "manual_v2", "manual_v2"]}
    assert "X-API-Key" not in headers


@pytest.mark.process
def test_api_key_header_sent(fake):
    with client_for(fake, api_key="s3cret") as client:
        client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])
    assert fake.requests[0][1]["X-API-Key"] == "s3cret"


@pytest.mark.process
def test_empty_batches_send_nothing(fake):
    with client_for(fake) as client:
        assert client.batch_search([], [], top_n=3) == []
        assert client.batch_fetch([], []) == []
    assert fake.requests == []


def test_input_validation_raises():
    with RetrieverClient("http://127.0.0.1:9", timeout=0.1) as client:
        with pytest.raises(ValueError):
            client.batch_search(["a", "b"], ["d"], top_n=1)
        with pytest.raises(ValueError):
            client.batch_search(["a"], ["d"], top_n=0)
        with pytest.raises(ValueError):
            client.batch_fetch([FetchSpec("image", 1)], [])
    with pytest.raises(ValueError):
        FetchSpec("video", 1)
    with pytest.raises(ValueError):
        FetchSpec("image", 0)
    assert FetchSpec("text", 12).wire() == "text, 12"
    assert FetchSpec.parse("image,4") == FetchSpec("image", 4)
    assert FetchSpec.parse("4-th") == FetchSpec("image", 4)


# --------------------------------------------------------------------------- chunking, concurrency


@pytest.mark.process
def test_chunking_and_concurrency_cap():
    fake = FakeRetriever(delay=0.1)
    try:
        queries = [f"q{i}" * (i + 1) for i in range(20)]
        docs = ["annual_report"] * 20
        with client_for(fake, max_batch=3, max_concurrency=3) as client:
            res = client.batch_search(queries, docs, top_n=1)
            expected = [wire_answer("/batch_search", {"query": [q], "id": ["annual_report"], "top_n": 1})[0][0]["id"] for q in queries]
            assert [r[0].page_id for r in res] == expected  # order preserved across chunks
            assert client.stats.calls == 7 and client.stats.items == 20
        sizes = sorted(len(b["query"]) for _, _, b in fake.requests)
        assert sizes == [2, 3, 3, 3, 3, 3, 3]
        assert fake.max_in_flight == 3  # concurrent, and never above the cap
    finally:
        fake.stop()


@pytest.mark.process
def test_concurrency_cap_holds_across_callers():
    fake = FakeRetriever(delay=0.05)
    try:
        with client_for(fake, max_batch=1, max_concurrency=2) as client:
            threads = [
                threading.Thread(target=client.batch_fetch, args=([FetchSpec("text", 1)] * 4, ["manual_v2"] * 4))
                for _ in range(3)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert len(fake.requests) == 12
        assert fake.max_in_flight <= 2
    finally:
        fake.stop()


# --------------------------------------------------------------------------- faults


@pytest.mark.process
def test_timeout_retries_then_fails_within_bound(fake):
    fake.script = [("hang",)] * 3
    with client_for(fake, timeout=0.3, retries=2, backoff=0.01) as client:
        start = time.monotonic()
        res = client.batch_fetch([FetchSpec("image", 1), FetchSpec("text", 1)], ["manual_v2", "manual_v2"])
        elapsed = time.monotonic() - start
        assert res == [RetrieverFailure("timeout", "retriever timed out after 3 tries")] * 2
        assert fake.paths()["/batch_fetch"] == 3
        assert 0.85 < elapsed < 2.5  # three 0.3 s tries plus tiny backoff, not the server's 10 s hang
        snap = client.stats.snapshot()
        assert snap["retries"] == 2 and snap["failures/timeout"] == 2 and snap["failures"] == 2


@pytest.mark.process
def test_500_then_success_is_retried(fake):
    fake.script = [("status", 500), ("status", 503)]
    with client_for(fake, retries=2) as client:
        res = client.batch_fetch([FetchSpec("text", 2)], ["annual_report"])
        assert res == [RetrievedPage("annual_report_2", "annual_report", 2, "text", "text of annual_report page 2")]
        assert client.stats.retries == 2 and client.stats.snapshot()["failures"] == 0
    assert fake.paths()["/batch_fetch"] == 3


@pytest.mark.process
def test_429_is_retried(fake):
    fake.script = [("status", 429)]
    with client_for(fake, retries=1) as client:
        assert isinstance(client.batch_search(["x"], ["manual_v2"], top_n=1)[0], list)
    assert len(fake.requests) == 2


@pytest.mark.process
def test_500_forever_fails_with_try_count(fake):
    fake.script = [("status", 500)] * 10
    with client_for(fake, retries=3) as client:
        res = client.batch_search(["a", "b"], ["manual_v2", "manual_v2"], top_n=2)
        assert res == [RetrieverFailure("http", "retriever answered HTTP 500 after 4 tries")] * 2
        assert client.stats.snapshot()["failures/http"] == 2
    assert len(fake.requests) == 4


@pytest.mark.process
def test_4xx_is_not_retried(fake):
    fake.script = [("status", 422), ("status", 500)]
    with client_for(fake, retries=3) as client:
        res = client.batch_fetch([FetchSpec("image", 1)], ["manual_v2"])
        assert res == [RetrieverFailure("http", "retriever answered HTTP 422 after 1 try")]
        assert client.stats.retries == 0
    assert len(fake.requests) == 1


@pytest.mark.process
def test_connection_refused_becomes_failure():
    fake = FakeRetriever()
    url = fake.url
    fake.stop()  # nothing listens on that port any more
    with RetrieverClient(url, timeout=0.5, retries=1, backoff=0.0) as client:
        res = client.batch_search(["a"], ["manual_v2"], top_n=1)
        assert res == [RetrieverFailure("connection", "retriever unreachable after 2 tries")]
        assert not client.health()


@pytest.mark.parametrize(
    "action, message_part",
    [
        (("raw", b"<html>oops</html>"), "not JSON"),
        (("json", {"results": []}), "expected a list"),
        (("json", [[], []]), "2 results for 3 requests"),
    ],
)
@pytest.mark.process
def test_garbage_bodies_fail_the_whole_chunk(fake, action, message_part):
    fake.script = [action]
    with client_for(fake, retries=2) as client:
        res = client.batch_fetch([FetchSpec("image", 1)] * 3, ["manual_v2"] * 3)
        assert len(res) == 3 and all(r.kind == "malformed" and message_part in r.message for r in res)
        assert client.stats.snapshot()["failures/malformed"] == 3
    assert len(fake.requests) == 1  # a 200 with garbage is not retried


@pytest.mark.process
def test_bad_item_shape_fails_that_item_only(fake):
    good = {"id": "text, 1", "contents": "hello"}
    fake.script = [("json", [good, {"id": 3}, "nope"]), ("json", [[{"id": "d_1", "contents": "x"}], [{"contents": "x"}], {}])]
    with client_for(fake) as client:
        res = client.batch_fetch([FetchSpec("text", 1)] * 3, ["d"] * 3)
        assert res[0] == RetrievedPage("d_1", "d", 1, "text", "hello")
        assert [r.kind for r in res[1:]] == ["malformed", "malformed"]
        res = client.batch_search(["a", "b", "c"], ["d"] * 3, top_n=2)
        assert res[0] == [RetrievedPage("d_1", "d", 1, "image", "x")]
        assert [r.kind for r in res[1:]] == ["malformed", "malformed"]


@pytest.mark.process
def test_bad_base64_image_is_passed_through_undecoded(fake):
    # Decoding (and turning bad images into error observations) is the rollout's job.
    fake.script = [("json", [{"id": "image, 2", "contents": "@@not base64!!"}])]
    with client_for(fake) as client:
        res = client.batch_fetch([FetchSpec("image", 2)], ["d"])
    assert res == [RetrievedPage("d_2", "d", 2, "image", "@@not base64!!")]


@pytest.mark.process
def test_fetch_echo_mismatch_is_malformed(fake):
    fake.script = [("json", [{"id": "text, 2", "contents": "a"}, {"id": "image, 1", "contents": "b"}])]
    with client_for(fake) as client:
        res = client.batch_fetch([FetchSpec("image", 1), FetchSpec("text", 2)], ["d", "d"])
    assert [r.kind for r in res] == ["malformed", "malformed"]  # swapped order is caught


@pytest.mark.process
def test_only_failing_chunk_fails(fake):
    fake.script = [("status", 400)]  # first request (first chunk) is rejected, others fine
    with client_for(fake, max_batch=2, max_concurrency=1) as client:
        res = client.batch_fetch([FetchSpec("text", 1)] * 5, ["manual_v2"] * 5)
    assert [type(r).__name__ for r in res] == ["RetrieverFailure"] * 2 + ["RetrievedPage"] * 3


@pytest.mark.process
def test_stats_snapshot_and_reset(fake):
    with client_for(fake, max_batch=2) as client:
        client.batch_search(["a", "boom", "c"], ["manual_v2"] * 3, top_n=1)
        snap = client.stats.snapshot()
        assert snap["calls"] == 2 and snap["items"] == 3 and snap["failures/server"] == 1
        assert snap["latency_s"] > 0 and snap["latency_max_s"] <= snap["latency_s"]
        assert all(isinstance(v, float) for v in snap.values())
        client.stats.reset()
        assert client.stats.snapshot()["calls"] == 0 and client.stats.snapshot()["failures"] == 0


# --------------------------------------------------------------------------- crops

CROP_BAND = (784, 784 * 64)


@pytest.mark.process
def test_crop_happy_path_and_the_body_sent(fake):
    boxes = [[0.1, 0.2, 0.5, 0.6], [0, 0, 1, 1], [0.5, 0.5, 0.4, 0.9], [0, 0, 1, 1]]
    with client_for(fake) as client:
        res = client.batch_crop(["annual_report", "manual_v2", "manual_v2", "manual_v2"], [2, 1, 1, 9], boxes, *CROP_BAND)
    # each crop is labelled with the region it shows
    assert res[0] == RetrievedPage("annual_report_2", "annual_report", 2, "image", crop_b64("annual_report", 2, boxes[0]),
                                   region=(0.1, 0.2, 0.5, 0.6))
    assert res[1] == RetrievedPage("manual_v2_1", "manual_v2", 1, "image", crop_b64("manual_v2", 1, [0.0, 0.0, 1.0, 1.0]),
                                   region=(0.0, 0.0, 1.0, 1.0))
    assert res[2].kind == "request" and "inverted" in res[2].message  # answered without a round trip
    assert res[3] == RetrieverFailure("request", "page 9 out of range for manual_v2")
    (path, _, body), = fake.requests
    assert path == "/batch_crop"
    assert body == {"id": ["annual_report", "manual_v2", "manual_v2"], "page": [2, 1, 9],
                    "box": [[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]],
                    "min_pixels": 784, "max_pixels": 784 * 64, "factor": 28}


@pytest.mark.process
def test_crops_at_a_large_band_are_sent_in_requests_the_server_accepts(fake):
    """A request may draw at most `contract.MAX_CROP_REQUEST_PIXELS` (each crop counted at max_pixels):
    at the largest band only a few crops fit one request, and the client chunks by that."""
    from retriever_server import contract

    max_pixels = 16384 * 28 * 28
    fit = contract.crops_per_request(max_pixels)
    assert 1 <= fit < contract.MAX_CROP_BATCH
    with client_for(fake, max_concurrency=1) as client:
        res = client.batch_crop(["manual_v2"] * (fit + 1), [1] * (fit + 1), [[0, 0, 1, 1]] * (fit + 1), 784, max_pixels)
    assert all(isinstance(r, RetrievedPage) for r in res)
    assert [len(body["id"]) for _, _, body in fake.requests] == [fit, 1]


@pytest.mark.process
def test_crop_timeouts_are_retried_then_fail_every_item(fake):
    fake.script = [("hang",)] * 3
    with client_for(fake, timeout=0.3, retries=2, backoff=0.01) as client:
        res = client.batch_crop(["manual_v2"] * 2, [1, 2], [[0, 0, 1, 1]] * 2, *CROP_BAND)
    assert res == [RetrieverFailure("timeout", "retriever timed out after 3 tries")] * 2
    assert fake.paths()["/batch_crop"] == 3


@pytest.mark.process
def test_crop_5xx_is_retried_then_answered(fake):
    fake.script = [("status", 500), ("status", 502)]
    with client_for(fake, retries=2) as client:
        res = client.batch_crop(["manual_v2"], [3], [[0, 0, 0.5, 0.5]], *CROP_BAND)
        assert res == [RetrievedPage("manual_v2_3", "manual_v2", 3, "image", crop_b64("manual_v2", 3, [0.0, 0.0, 0.5, 0.5]),
                                     region=(0.0, 0.0, 0.5, 0.5))]
        assert client.stats.retries == 2
    assert fake.paths()["/batch_crop"] == 3


@pytest.mark.process
def test_crop_5xx_forever_and_refusals_past_the_budget_fail_every_item(fake):
    fake.script = [("status", 503)] * 3
    with client_for(fake, retries=2) as client:
        res = client.batch_crop(["manual_v2"] * 2, [1, 2], [[0, 0, 1, 1]] * 2, *CROP_BAND)
    assert [r.kind for r in res] == ["http", "http"]
    fake.script = [("refuse", 2)] * 10
    with client_for(fake, overload_budget_s=0.5) as client:
        res = client.batch_crop(["manual_v2"], [1], [[0, 0, 1, 1]], *CROP_BAND)
    assert [r.kind for r in res] == ["overloaded"]


@pytest.mark.process
def test_crop_garbage_and_misplaced_answers_are_malformed(fake):
    fake.script = [("raw", b"<html>oops</html>"),
                   ("json", [{"id": "manual_v2_2", "contents": "a"}, {"id": "manual_v2_1", "contents": "b"}, {"id": 3}])]
    with client_for(fake) as client:
        res = client.batch_crop(["manual_v2"] * 2, [1, 2], [[0, 0, 1, 1]] * 2, *CROP_BAND)
        assert all(r.kind == "malformed" and "not JSON" in r.message for r in res)
        res = client.batch_crop(["manual_v2"] * 3, [1, 2, 3], [[0, 0, 1, 1]] * 3, *CROP_BAND)
        assert [r.kind for r in res] == ["malformed"] * 3  # swapped answers are caught


def test_crop_connection_refused_becomes_failure():
    with RetrieverClient("http://127.0.0.1:9", timeout=0.5, retries=0) as client:
        res = client.batch_crop(["d"], [1], [[0, 0, 1, 1]], *CROP_BAND)
    assert [r.kind for r in res] == ["connection"]


# --------------------------------------------------------------------------- pure parsing


def test_page_parsing_rules():
    data = [
        [
            {"id": "my_doc_2024_7", "contents": "a"},  # underscores in the doc id
            {"id": "weird", "contents": "b", "page": 4, "score": 1.5},  # explicit page field wins
            {"id": "noPage", "contents": "c"},
        ]
    ]
    (hits,) = parse_search_results(data, ["my_doc_2024"], top_n=5)
    assert [(h.page_id, h.page, h.score) for h in hits] == [("my_doc_2024_7", 7, None), ("weird", 4, 1.5), ("noPage", None, None)]
    (hits,) = parse_search_results(data, ["my_doc_2024"], top_n=1)
    assert len(hits) == 1  # never more than top_n


def test_parse_fetch_tolerates_unreadable_echo():
    res = parse_fetch_results([{"id": "whatever", "contents": "t"}], [FetchSpec("text", 5)], ["d"])
    assert res == [RetrievedPage("d_5", "d", 5, "text", "t")]


def test_decode_answer_reads_plain_bytes_as_json():
    # A transport written before RawAnswer hands back the body alone: JSON, as then.
    assert transport_module.decode_answer(b'[{"id": "d_1", "contents": "QQ=="}]') == [{"id": "d_1", "contents": "QQ=="}]
    with pytest.raises(transport_module.TransportMalformed, match="not JSON"):
        transport_module.decode_answer(b"\x91\xc0")


def test_bytes_are_an_image_never_a_text_page_nor_an_error_reason():
    jpeg = b"\xff\xd8 a jpeg"
    specs = [FetchSpec("image", 1), FetchSpec("text", 2), FetchSpec("image", 3)]
    res = parse_fetch_results([{"id": "image, 1", "contents": jpeg}, {"id": "text, 2", "contents": b"text"},
                               {"id": "error", "contents": b"why"}], specs, ["d"] * 3)
    assert res[0] == RetrievedPage("d_1", "d", 1, "image", jpeg)
    assert [r.kind for r in res[1:]] == ["malformed", "malformed"]
    (hits,) = parse_search_results([[{"id": "d_2", "contents": jpeg, "page": 2}]], ["d"], top_n=1)
    assert hits == [RetrievedPage("d_2", "d", 2, "image", jpeg)]


@pytest.mark.process
def test_error_item_with_an_unhashable_code_is_a_counted_failure(fake):
    # `code` is only ever a string; a list (or any garbage) there is a server fault, not a crash.
    fake.script = [("json", [{"id": "error", "contents": "bad page", "code": ["page_out_of_range"]},
                             {"id": "error", "contents": "no such page", "code": "page_out_of_range"}]),
                   ("json", [[{"id": "error", "contents": "cannot search", "code": {"x": 1}}]])]
    with client_for(fake) as client:
        res = client.batch_fetch([FetchSpec("image", 1), FetchSpec("image", 9)], ["manual_v2"] * 2)
        assert res == [RetrieverFailure("server", "bad page"), RetrieverFailure("request", "no such page")]
        assert client.batch_search(["q"], ["manual_v2"], top_n=1) == [RetrieverFailure("server", "cannot search")]
        snap = client.stats.snapshot()
        assert snap["failures/server"] == 2 and snap["failures/request"] == 1


@pytest.mark.process
def test_a_body_nested_too_deep_to_decode_is_malformed(fake):
    # Both decoders raise RecursionError (not ValueError) past their depth limit.
    fake.script = [("raw", b"[" * 100_000)]
    with client_for(fake) as client:
        res = client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])
    assert res == [RetrieverFailure("malformed", "retriever sent a body that is not JSON")]


def test_a_score_no_float_can_hold_is_dropped():
    # The standard library's JSON (the fallback without msgspec) reads any integer.
    (hits,) = parse_search_results([[{"id": "d_1", "contents": "x", "score": 10**400}]], ["d"], top_n=1)
    assert hits == [RetrievedPage("d_1", "d", 1, "image", "x", None)]


@pytest.mark.parametrize("fail_fast, tries", [(True, 1), (False, 3)])
@pytest.mark.process
def test_both_transports_report_the_tries_they_made(fail_fast, tries):
    from vrag_rollout.retrieval.aio import AsyncHttpTransport

    closed = FakeRetriever()
    url = closed.url
    closed.stop()  # a refused connection: fail-fast gives up after the first try
    for cls in (HttpTransport, AsyncHttpTransport):
        retried = []
        transport = cls(url, retries=2, backoff=0.0, fail_fast_on_connect=fail_fast, on_retries=retried.append)

        async def call():
            try:
                return await transport.send_async("/batch_fetch", {"query": [], "id": []}, 1.0)
            finally:
                await transport.aclose()

        with pytest.raises(TransportConnectionError) as err:
            if cls is HttpTransport:
                transport.post("/batch_fetch", {"query": [], "id": []}, timeout=1.0)
            else:
                asyncio.run(call())
        expected = f"retriever unreachable after {tries_text(tries)}"
        assert (str(err.value), err.value.tries, sum(retried)) == (expected, tries, tries - 1), cls.__name__


@pytest.mark.process
def test_http_transport_raises_typed_errors(fake):
    fake.script = [("status", 404), ("hang",)]
    transport = HttpTransport(fake.url, retries=0)
    with pytest.raises(TransportHTTPError) as err:
        transport.post("/batch_fetch", {"query": [], "id": []}, timeout=1.0)
    assert err.value.status == 404 and err.value.tries == 1
    with pytest.raises(TransportTimeout):
        transport.post("/batch_fetch", {"query": [], "id": []}, timeout=0.2)
    transport.close()


# --------------------------------------------------------------------------- properties

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
    | st.binary(max_size=5),  # MessagePack answers carry bytes too
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["id", "contents", "page", "score", "code", "x"]), inner, max_size=4),
    max_leaves=12,
)
_item = st.fixed_dictionaries({"id": st.sampled_from(["error", "d_1", "image, 1", "text, 2", "zz"]),
                               "contents": st.text(max_size=4) | st.binary(max_size=4)},
                              optional={"code": st.sampled_from(["page_out_of_range", "unreadable"]) | _json})
_answer = st.lists(st.one_of(_item, st.lists(st.one_of(_item, _json), max_size=3), _json), min_size=0, max_size=4)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(data=st.one_of(_json, _answer), n=st.integers(0, 4) | st.none())
def test_parsers_never_crash_on_any_body(data, n):
    """Whatever the server sends: one outcome per request, or MalformedResponse; nothing else."""
    if n is None:  # as many requests as the body has entries: the items themselves get parsed
        n = min(len(data), 4) if isinstance(data, list) else 0
    specs = [FetchSpec("image", 1), FetchSpec("text", 2)] * 2
    for parse in (
        lambda: parse_search_results(data, ["d"] * n, 2),
        lambda: parse_fetch_results(data, specs[:n], ["d"] * n),
    ):
        try:
            out = parse()
        except MalformedResponse:
            continue
        assert len(out) == n
        for r in out:
            assert isinstance(r, (RetrievedPage, RetrieverFailure)) or (
                isinstance(r, list) and len(r) <= 2 and all(isinstance(p, RetrievedPage) for p in r)
            )


# --------------------------------------------------------------------------- overload, replicas


@pytest.mark.process
def test_refusal_waits_retry_after_then_succeeds(fake):
    fake.script = [("refuse", 1)]
    with client_for(fake, retries=3) as client:
        start = time.monotonic()
        res = client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])
        elapsed = time.monotonic() - start
        assert res == [RetrievedPage("manual_v2_1", "manual_v2", 1, "text", "text of manual_v2 page 1")]
        assert 1.0 <= elapsed < 3.0  # never before Retry-After; jitter adds at most half of it
        snap = client.stats.snapshot()
        assert snap["overloaded"] == 1 and snap["failures"] == 0
        assert snap["retries"] == 0  # urllib3 did not retry the refusal on its own
        assert 1.0 <= snap["overload_wait_s"] < 1.5
    assert fake.paths()["/batch_fetch"] == 2


@pytest.mark.process
def test_refusals_past_the_budget_fail_as_overloaded_and_are_counted(fake):
    fake.script = [("refuse", 2)] * 10
    with client_for(fake, overload_budget_s=1.0) as client:
        start = time.monotonic()
        res = client.batch_search(["a", "b"], ["manual_v2", "manual_v2"], top_n=1)
        assert time.monotonic() - start < 1.0  # a 2 s wait cannot fit in a 1 s budget: no sleep
        assert [r.kind for r in res] == ["overloaded", "overloaded"]
        assert "overloaded" in res[0].message
        snap = client.stats.snapshot()
        assert snap["failures/overloaded"] == 2 and snap["failures"] == 2 and snap["overloaded"] == 1
    assert len(fake.requests) == 1


@pytest.mark.process
def test_503_without_retry_after_is_an_ordinary_retried_fault(fake):
    fake.script = [("status", 503)] * 5
    with client_for(fake, retries=1) as client:
        res = client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])
        assert res == [RetrieverFailure("http", "retriever answered HTTP 503 after 2 tries")]
        assert client.stats.snapshot()["overloaded"] == 0


def test_overload_wait_honours_retry_after_with_jitter():
    with RetrieverClient("http://127.0.0.1:9", backoff=0.1) as client:
        waits = [client._overload_wait(2.0, 1) for _ in range(200)]
        assert all(2.0 <= w < 3.0 for w in waits) and len(set(waits)) > 100
        assert 0.1 <= client._overload_wait(None, 1) < 0.15  # no hint: exponential backoff
        assert 0.1 <= client._overload_wait(0.0, 1) < 0.15  # "Retry-After: 0": backoff too
        assert 0.4 <= client._overload_wait(None, 3) < 0.6
        assert 0.8 <= client._overload_wait(0.0, 9) < 1.2  # doubling stops at 8x
        assert client._overload_wait(1000.0, 1) == 10.0  # capped


def test_overload_wait_follows_the_finer_retry_after_ms_hint():
    with RetrieverClient("http://127.0.0.1:9", backoff=0.5) as client:
        waits = [client._overload_wait(0.0, 1, 0.02) for _ in range(200)]
        assert all(0.02 <= w < 0.03 for w in waits)  # the server's 20 ms, not the 0.5 s backoff
        assert 0.08 <= client._overload_wait(0.0, 3, 0.02) < 0.12  # doubling per refusal
        assert 0.16 <= client._overload_wait(0.0, 9, 0.02) < 0.24  # up to 8x
        assert client._overload_wait(0.0, 1, 0.0) >= 0.002  # "0 ms" is no busy loop


@pytest.mark.process
def test_refusal_with_retry_after_ms_is_waited_out_in_milliseconds(fake):
    fake.script = [("refuse_ms", 30)]
    with client_for(fake, backoff=2.0) as client:  # a backoff this long would show
        start = time.monotonic()
        res = client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])
        elapsed = time.monotonic() - start
        assert res == [RetrievedPage("manual_v2_1", "manual_v2", 1, "text", "text of manual_v2 page 1")]
        assert 0.03 <= elapsed < 1.0
        snap = client.stats.snapshot()
        assert snap["overloaded"] == 1 and 0.03 <= snap["overload_wait_s"] < 0.05
    assert fake.paths()["/batch_fetch"] == 2


def acquire(limit: AdaptiveLimit, deadline: float):
    """The window's acquire, run to completion (the client runs it on its event loop)."""
    return asyncio.run(limit.acquire(deadline))


def test_adaptive_limit_halves_once_per_round_and_waits_for_answers():
    limit = AdaptiveLimit(8)
    far = time.monotonic() + 60
    rounds = [acquire(limit, far) for _ in range(8)]
    assert limit.in_flight == 8 and acquire(limit, time.monotonic()) is None  # full: no room
    limit.release(rounds[0], "refused")
    assert (limit.limit, limit.in_flight) == (4, 7)
    limit.release(rounds[1], "refused")  # sent in the same round: no second cut
    assert limit.limit == 4
    # 6 still at the server, the window is 4: nothing more goes until answers come back.
    assert acquire(limit, time.monotonic() + 0.02) is None
    for r in rounds[2:5]:
        limit.release(r, "ok")  # answers grow the window by 1/4 each: 4.75, room for 1
    assert 4.7 < limit.limit < 4.8 and limit.in_flight == 3
    assert acquire(limit, time.monotonic()) is not None
    for r in rounds[5:]:
        limit.release(r, "failed")  # faults say nothing about load


def test_adaptive_limit_never_stays_above_what_is_still_in_flight():
    limit = AdaptiveLimit(8)
    far = time.monotonic() + 60
    rounds = [acquire(limit, far) for _ in range(8)]
    for r in rounds[:6]:  # a wave refused but for two: the server took two of ours
        limit.release(r, "refused")
    assert (limit.limit, limit.in_flight) == (2, 2)
    assert acquire(limit, time.monotonic() + 0.02) is None  # each answer will clock one request
    limit.release(rounds[6], "ok")
    assert acquire(limit, time.monotonic()) is not None


def test_adaptive_limit_slow_start_back_to_half_then_one_per_round():
    limit = AdaptiveLimit(8)
    far = time.monotonic() + 60
    rounds = [acquire(limit, far) for _ in range(8)]
    for r in rounds:  # everything refused: nothing left in flight
        limit.release(r, "refused")
    assert (limit.limit, limit.threshold) == (1, 4)
    for expected in (2, 3, 4):  # one more per answer up to the half the cut kept
        limit.release(acquire(limit, far), "ok")
        assert limit.limit == expected
    limit.release(acquire(limit, far), "ok")
    assert limit.limit == 4.25  # then about one more per round of answers
    for _ in range(200):
        limit.release(acquire(limit, far), "ok")
    assert limit.limit == 8  # never above the maximum
    for _ in range(10):
        limit.release(acquire(limit, far), "refused")
    assert limit.limit == 1  # nor below one


def test_adaptive_limit_pauses_only_with_nothing_in_flight():
    limit = AdaptiveLimit(4)
    far = time.monotonic() + 60
    a, b = acquire(limit, far), acquire(limit, far)
    limit.release(a, "refused", pause_s=30.0)  # b is still at the server: its answer clocks us
    limit.release(b, "ok")
    start = time.monotonic()
    assert acquire(limit, far) is not None and time.monotonic() - start < 1.0


def test_adaptive_limit_does_not_sleep_a_pause_past_the_deadline():
    limit = AdaptiveLimit(4)
    limit.release(acquire(limit, time.monotonic() + 60), "refused", pause_s=30.0)
    start = time.monotonic()
    assert acquire(limit, start + 1.0) is None
    assert time.monotonic() - start < 0.5  # known at once: not slept


def test_adaptive_limit_sends_nothing_during_a_refusals_pause():
    limit = AdaptiveLimit(4)
    far = time.monotonic() + 60
    limit.release(acquire(limit, far), "refused", pause_s=0.2)
    start = time.monotonic()
    assert acquire(limit, start + 0.05) is None  # room, but the server asked for 0.2 s
    assert acquire(limit, far) is not None
    assert 0.18 <= time.monotonic() - start < 2.0


@pytest.mark.process
def test_a_refused_client_keeps_fewer_requests_in_flight(fake):
    fake.delay = 0.05  # requests overlap
    fake.script = [("refuse_ms", 1)] * 8  # the first wave is refused
    with client_for(fake, max_concurrency=8, max_batch=1) as client:
        res = client.batch_search(["q"] * 24, ["manual_v2"] * 24, top_n=1)
        assert all(isinstance(r, list) for r in res) and client.stats.overloaded == 8
    answered = [n for action, n in fake.arrivals if action == "answer"]
    assert len(answered) == 24
    # The window was halved once (8 -> 4) and regrows by about one per round of answers: the
    # first rounds after the cut stay near 4; without it all 8 threads would come back at once.
    assert max(answered[:8]) <= 5


def test_parse_urls():
    assert parse_urls("http://a:1") == ["http://a:1"]
    assert parse_urls(" http://a:1 , http://b:2,") == ["http://a:1", "http://b:2"]
    assert parse_urls(["http://a:1", "http://b:2"]) == ["http://a:1", "http://b:2"]
    assert parse_urls(None) == []
    with pytest.raises(ValueError):
        RetrieverClient(" , ")


def test_replica_set_round_robin_puts_down_replicas_last():
    now = [0.0]
    replicas = ReplicaSet(3, clock=lambda: now[0])
    assert [replicas.order()[0] for _ in range(4)] == [0, 1, 2, 0]
    replicas.mark_down(1, 5.0)
    assert replicas.order() == [2, 0, 1]  # started at 1, which is down: it goes last
    now[0] = 6.0
    assert replicas.order() == [2, 0, 1]  # back in rotation after down_s
    assert replicas.order() == [0, 1, 2]


@pytest.mark.process
def test_batches_spread_over_replicas():
    a, b = FakeRetriever(), FakeRetriever()
    try:
        with RetrieverClient([a.url, b.url], max_batch=1, max_concurrency=1, backoff=0.0) as client:
            res = client.batch_fetch([FetchSpec("text", 1)] * 10, ["manual_v2"] * 10)
        assert all(isinstance(r, RetrievedPage) for r in res)
        assert (len(a.requests), len(b.requests)) == (5, 5)
    finally:
        a.stop()
        b.stop()


@pytest.mark.process
def test_refused_chunk_goes_to_another_replica_without_waiting():
    a, b = FakeRetriever(), FakeRetriever()
    a.script = [("refuse", 5)] * 3
    try:
        with RetrieverClient(f"{a.url},{b.url}", max_batch=1, max_concurrency=1, backoff=0.0) as client:
            start = time.monotonic()
            res = client.batch_fetch([FetchSpec("text", 1)] * 4, ["manual_v2"] * 4)
            assert time.monotonic() - start < 2.0  # nobody waited the 5 s
            assert all(isinstance(r, RetrievedPage) for r in res)
            assert client.stats.overloaded >= 1 and client.stats.snapshot()["failures"] == 0
    finally:
        a.stop()
        b.stop()


@pytest.mark.process
def test_failover_from_a_dead_replica():
    dead, live = FakeRetriever(), FakeRetriever()
    dead_url = dead.url
    dead.stop()
    with RetrieverClient([dead_url, live.url], max_batch=1, max_concurrency=1, timeout=1.0,
                         retries=2, backoff=0.0, down_s=60) as client:
        start = time.monotonic()
        res = client.batch_search([f"q{i}" for i in range(6)], ["manual_v2"] * 6, top_n=1)
        assert time.monotonic() - start < 3.0
        assert all(isinstance(r, list) for r in res)
        assert client.stats.failovers == 1  # after one failure the dead replica is tried last
        assert client.health()
    live.stop()


@pytest.mark.process
def test_a_replica_sending_garbage_fails_over_to_another():
    bad, good = FakeRetriever(), FakeRetriever()
    bad.script = [("raw", b"<html>oops</html>")] * 5
    try:
        with RetrieverClient([bad.url, good.url], max_batch=1, max_concurrency=1, backoff=0.0,
                             down_s=60) as client:
            res = client.batch_fetch([FetchSpec("text", 1)] * 3, ["manual_v2"] * 3)
            assert all(isinstance(r, RetrievedPage) for r in res)
            assert client.stats.failovers == 1 and client.stats.snapshot()["failures"] == 0
        assert len(bad.requests) == 1  # then tried last
    finally:
        bad.stop()
        good.stop()


@pytest.mark.process
def test_answers_are_decoded_after_the_window_slot_is_given_back(fake, monkeypatch):
    seen = []
    decode = transport_module.decode_json

    def recording_decode(data):
        seen.append(client._limits[0].in_flight)
        return decode(data)

    monkeypatch.setattr(transport_module, "decode_json", recording_decode)
    with client_for(fake, max_batch=1, max_concurrency=1) as client:
        res = client.batch_fetch([FetchSpec("text", 1)] * 3, ["manual_v2"] * 3)
    assert all(isinstance(r, RetrievedPage) for r in res)
    assert seen == [0, 0, 0]  # the server's work was done: the next request may go meanwhile


@pytest.mark.process
def test_all_replicas_down_is_a_counted_failure_not_an_exception():
    a, b = FakeRetriever(), FakeRetriever()
    urls = [a.url, b.url]
    a.stop()
    b.stop()
    with RetrieverClient(urls, timeout=0.5, backoff=0.0) as client:
        res = client.batch_search(["x", "y"], ["d", "d"], top_n=1)
        assert [r.kind for r in res] == ["connection", "connection"]
        assert client.stats.snapshot()["failures/connection"] == 2
        assert not client.health()


@pytest.mark.process
def test_a_client_nobody_closes_shuts_its_loop_down_when_collected(fake):
    import gc

    client = client_for(fake)
    assert isinstance(client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])[0], RetrievedPage)
    loop = client._loop.loop
    del client
    gc.collect()
    assert loop.is_closed()


@pytest.mark.process
def test_close_twice_and_blocking_transports_share_the_cap(fake):
    from vrag_rollout.retrieval.fixtures import RecordingTransport

    client = RetrieverClient(None, transport=RecordingTransport(HttpTransport(fake.url)), max_batch=1,
                             max_concurrency=2)
    res = client.batch_fetch([FetchSpec("text", 1)] * 4, ["manual_v2"] * 4)  # blocking transport: pool
    assert all(isinstance(r, RetrievedPage) for r in res) and fake.max_in_flight <= 2
    client.close()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.batch_fetch([FetchSpec("text", 1)], ["manual_v2"])
