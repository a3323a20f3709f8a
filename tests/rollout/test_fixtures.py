"""Record from a local wire-format server, replay through RetrieverClient(transport=FixtureTransport)."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vrag_rollout.retrieval.fixtures import (
    FixtureMiss,
    Fixtures,
    FixtureTransport,
    RecordingTransport,
    record_fixtures,
)
from vrag_rollout.retrieval.blocking import HttpTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.types import FetchSpec, RetrievedPage, RetrieverFailure

PAGES = {"report": 4, "manual": 3}


def image(doc: str, page: int) -> str:
    return base64.b64encode(f"jpeg bytes of {doc} p{page} ".encode() * 20).decode()


def answer(path: str, body: dict):
    if path == "/batch_search":
        out = []
        for q, d in zip(body["query"], body["id"]):
            if d not in PAGES:
                out.append([{"id": "error", "contents": f"unknown document {d}"}])
            else:
                ranked = sorted(range(1, PAGES[d] + 1), key=lambda p: (sum(map(ord, q)) * p) % 7)
                out.append([{"id": f"{d}_{p}", "contents": image(d, p), "score": 1.0 / k} for k, p in enumerate(ranked[: body["top_n"]], 1)])
        return out
    out = []
    for spec, d in zip(body["query"], body["id"]):
        modality, page = spec.split(", ")
        if d not in PAGES or int(page) > PAGES[d]:
            out.append({"id": "error", "contents": f"no page {page} in {d}"})
        else:
            out.append({"id": spec, "contents": image(d, int(page)) if modality == "image" else f"Page {page} of {d}: \u00e9t\u00e9"})
    return out


@pytest.fixture
def server():
    state = {"down": False}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            code, data = (503, b"{}") if state["down"] else (200, json.dumps(answer(self.path, body)).encode())
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()


SEARCHES = [("report", "revenue"), ("report", "risk factors"), ("manual", "reset button"), ("missing_doc", "x")]
FETCHES = [("report", "image, 2"), ("report", "text, 2"), ("manual", "image, 3"), ("manual", "text, 9"), ("manual", "image, 1")]


@pytest.fixture
def recorded(server, tmp_path):
    url, _ = server
    path = tmp_path / "fx.json"
    summary = record_fixtures(url, path, searches=SEARCHES, fetches=FETCHES, top_n=2)
    return url, path, summary


def live_results(url: str, searches, fetches, top_n=2):
    with RetrieverClient(url, timeout=5.0) as c:
        return (
            c.batch_search([q for _, q in searches], [d for d, _ in searches], top_n),
            c.batch_fetch([FetchSpec.parse(s) for _, s in fetches], [d for d, _ in fetches]),
        )


@pytest.mark.process
def test_record_summary_and_file_shape(recorded):
    _, path, summary = recorded
    assert summary["searches"] == 4 and summary["fetches"] == 5 and summary["server_errors"] == 2
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == 1 and set(doc) == {"format", "search", "fetch", "blobs"}
    assert [(e["doc_id"], e["query"]) for e in doc["search"]] == sorted((d, q) for d, q in SEARCHES)
    text_entry = next(e for e in doc["fetch"] if e["spec"] == "text, 2")
    assert text_entry["result"] == {"id": "text, 2", "contents": "Page 2 of report: \u00e9t\u00e9"}  # inline, readable
    assert "été" in path.read_text(encoding="utf-8")


@pytest.mark.process
def test_blobs_are_deduplicated(recorded):
    _, path, summary = recorded
    doc = json.loads(path.read_text(encoding="utf-8"))
    refs = [r["blob"] for e in doc["search"] for r in e["results"] if "blob" in r]
    refs += [e["result"]["blob"] for e in doc["fetch"] if "blob" in e["result"]]
    assert len(refs) == 3 * 2 + 3  # 3 good searches x top 2, plus 3 good image fetches
    assert summary["blobs"] == len(set(refs)) == len(doc["blobs"]) < len(refs)  # repeats stored once
    assert all("contents" not in r for e in doc["search"] for r in e["results"] if "blob" in r)
    # one blob per distinct image, keyed by the hash of its contents only
    assert len(set(doc["blobs"].values())) == len(doc["blobs"])
    assert all(k == hashlib.sha256(v.encode()).hexdigest() for k, v in doc["blobs"].items())


@pytest.mark.process
def test_rerecording_is_byte_identical(server, recorded, tmp_path):
    url, path, _ = recorded
    again = tmp_path / "again.json"
    # same items, different order and duplicates: the file must not change
    record_fixtures(url, again, searches=list(reversed(SEARCHES)) + SEARCHES[:1], fetches=FETCHES[::-1], top_n=2)
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.process
def test_replay_equals_live_in_any_order_and_chunking(recorded):
    url, path, _ = recorded
    live_s, live_f = live_results(url, SEARCHES, FETCHES)
    assert any(isinstance(r, RetrieverFailure) for r in live_f) and isinstance(live_f[0], RetrievedPage)
    rng = random.Random(0)
    for max_batch in (1, 2, 64):
        s_order = rng.sample(range(len(SEARCHES)), len(SEARCHES))
        f_order = rng.sample(range(len(FETCHES)), len(FETCHES))
        transport = FixtureTransport.load(path)
        with RetrieverClient("fixture://", max_batch=max_batch, transport=transport) as c:
            got_s = c.batch_search([SEARCHES[i][1] for i in s_order], [SEARCHES[i][0] for i in s_order], 2)
            got_f = c.batch_fetch([FetchSpec.parse(FETCHES[i][1]) for i in f_order], [FETCHES[i][0] for i in f_order])
            assert c.health()
        assert got_s == [live_s[i] for i in s_order]
        assert got_f == [live_f[i] for i in f_order]
        assert transport.requests["/batch_search"] == -(-len(SEARCHES) // max_batch)


@pytest.mark.process
def test_replay_works_with_server_gone(server, recorded):
    url, path, _ = recorded
    _, state = server
    state["down"] = True  # the live server now fails; replay must not care
    with RetrieverClient(url, transport=FixtureTransport.load(path)) as c:
        (hits,) = c.batch_search(["revenue"], ["report"], 2)
    assert [h.page_id for h in hits] and all(h.score is not None for h in hits)


@pytest.mark.process
def test_strict_miss_raises_naming_the_key(recorded):
    _, path, _ = recorded
    with RetrieverClient("fixture://", transport=FixtureTransport.load(path)) as c:
        with pytest.raises(FixtureMiss, match=r"'report', 'never asked', 2"):
            c.batch_search(["revenue", "never asked"], ["report", "report"], 2)
        with pytest.raises(FixtureMiss, match=r"'report', 'text, 4'"):
            c.batch_fetch([FetchSpec("text", 4)], ["report"])
        with pytest.raises(FixtureMiss):
            c.batch_search(["revenue"], ["report"], 3)  # top_n is part of the key


@pytest.mark.process
def test_lenient_miss_is_a_per_item_failure(recorded):
    _, path, _ = recorded
    with RetrieverClient("fixture://", transport=FixtureTransport.load(path, strict=False)) as c:
        res = c.batch_fetch([FetchSpec("image", 2), FetchSpec("text", 4)], ["report", "report"])
        assert isinstance(res[0], RetrievedPage)
        assert res[1].kind == "server" and "no recorded result" in res[1].message and "text, 4" in res[1].message
        res = c.batch_search(["nope"], ["report"], 2)
        assert res[0].kind == "server"


def test_legacy_and_spaced_specs_share_a_key():
    fx = Fixtures()
    fx.add_fetch("d", "image,3", {"id": "image, 3", "contents": "QUJD"})
    t = FixtureTransport(fx)
    assert t.post("/batch_fetch", {"query": ["3-th", "image, 3"], "id": ["d", "d"]}, 1.0) == [{"id": "image, 3", "contents": "QUJD"}] * 2


def test_load_rejects_unknown_format_and_missing_blob(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"format": 2, "search": [], "fetch": [], "blobs": {}}))
    with pytest.raises(ValueError, match="format"):
        Fixtures.load(p)
    p.write_text(json.dumps({"format": 1, "search": [], "fetch": [{"doc_id": "d", "spec": "image, 1", "result": {"id": "image, 1", "blob": "abc"}}], "blobs": {}}))
    with pytest.raises(ValueError, match="missing blob"):
        Fixtures.load(p)


@pytest.mark.process
def test_recording_during_outage_raises_and_writes_nothing(server, tmp_path):
    url, state = server
    state["down"] = True
    path = tmp_path / "fx.json"
    with pytest.raises(RuntimeError, match="recording incomplete"):
        record_fixtures(url, path, searches=SEARCHES, fetches=[], top_n=2)
    assert not path.exists()


@pytest.mark.process
def test_recording_transport_records_what_the_client_sees(server, tmp_path):
    url, _ = server
    rec = RecordingTransport(HttpTransport(url))
    with RetrieverClient(url, max_batch=1, transport=rec) as c:
        c.batch_fetch([FetchSpec("text", 1), FetchSpec("image", 1)], ["manual", "manual"])
    rec.save(tmp_path / "r.json")
    fx = Fixtures.load(tmp_path / "r.json")
    assert set(fx.fetch) == {("manual", "text, 1"), ("manual", "image, 1")}
    assert fx.fetch[("manual", "image, 1")]["contents"] == image("manual", 1)


def test_an_image_recorded_from_a_binary_answer_is_stored_as_json_carries_it(tmp_path):
    jpeg = b"\xff\xd8 jpeg bytes"
    fx = Fixtures()
    fx.add_fetch("manual", "image, 1", {"id": "image, 1", "contents": jpeg})
    fx.add_search("manual", "reset", 1, [{"id": "manual_1", "contents": jpeg}])
    fx.save(tmp_path / "b.json")
    as_text = base64.b64encode(jpeg).decode()
    back = Fixtures.load(tmp_path / "b.json")
    assert back.fetch[("manual", "image, 1")]["contents"] == as_text
    assert back.search[("manual", "reset", 1)][0]["contents"] == as_text
    assert len(json.loads((tmp_path / "b.json").read_text())["blobs"]) == 1  # one image, stored once


def test_recording_keeps_binary_images_and_skips_a_text_page_sent_as_bytes(tmp_path):
    class BinaryServer:  # answers as a MessagePack server would, one text page wrongly as bytes
        def post(self, path, body, timeout):
            return [{"id": "image, 1", "contents": b"\xff\xd8 jpeg"}, {"id": "text, 1", "contents": b"text"}]

        def get(self, path, timeout):
            return {}

        def close(self):
            pass

    rec = RecordingTransport(BinaryServer())
    with RetrieverClient("fixture://", transport=rec) as c:
        image, text = c.batch_fetch([FetchSpec("image", 1), FetchSpec("text", 1)], ["manual", "manual"])
    assert image.contents == b"\xff\xd8 jpeg" and text.kind == "malformed"
    rec.save(tmp_path / "r.json")
    fx = Fixtures.load(tmp_path / "r.json")
    assert set(fx.fetch) == {("manual", "image, 1")}
    assert fx.fetch[("manual", "image, 1")]["contents"] == base64.b64encode(b"\xff\xd8 jpeg").decode()
