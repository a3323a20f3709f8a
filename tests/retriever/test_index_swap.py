"""Index lifecycle: a live swap under concurrent queries, and kill -9 of a re-index anywhere."""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from retriever_server.api.admission import AdmissionLimits
from retriever_server.api.app import create_app
from retriever_server.api.testing import serve_in_thread
from retriever_server.indexing.indexer import build_index
from retriever_server.sample_corpus import SAMPLE_FACTS
from retriever_server.storage.manifest import read_manifest
from retriever_server.storage.store import PageStore
from tests.retriever.serving_helpers import ROOT

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)

CHILD = Path(__file__).with_name("reindex_child.py")


def test_live_swap_under_concurrent_queries_fails_no_request(sample_pdfs, tmp_path):
    out = tmp_path / "idx"
    build_index(sample_pdfs, out, progress=False)
    row = read_manifest(out).pages[5]  # a page of safety_manual, fetched below
    page_bytes = {"old": (out / row.image).read_bytes()}
    queries = list(SAMPLE_FACTS)
    search = {"query": queries, "id": [SAMPLE_FACTS[q][0] for q in queries], "top_n": 1}
    want = [f"{d}_{p}" for d, p in SAMPLE_FACTS.values()]
    fetch = {"query": [f"image, {row.page}", f"text, {row.page}"], "id": [row.doc_id] * 2}
    stop = threading.Event()
    problems: list[str] = []
    seen: dict[str, set[bytes]] = {}  # index version -> the page image bytes it served
    counts = [0]

    def query_loop(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                r = http.post("/batch_search", json=search)
                if r.status_code != 200 or [hits[0]["id"] for hits in r.json()] != want:
                    problems.append(f"search {r.status_code} {r.text[:200]}")
                f = http.post("/batch_fetch", json=fetch)
                items = f.json() if f.status_code == 200 else []
                if f.status_code != 200 or any(item["id"] == "error" for item in items):
                    problems.append(f"fetch {f.status_code} {f.text[:200]}")
                else:
                    seen.setdefault(f.headers["X-Index-Version"], set()).add(
                        base64.b64decode(items[0]["contents"]))
                counts[0] += 2

    # Generous admission limits: this test is about the swap, on a machine shared with others.
    with serve_in_thread(out, admission=AdmissionLimits(max_queue=64, max_wait_s=60,
                                                         queue_services=None)) as url:
        threads = [threading.Thread(target=query_loop, args=(url,)) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            # Re-index in place (other JPEG quality: same names, other bytes), then reload.
            build_index(sample_pdfs, out, progress=False, jpeg_quality=40)
            page_bytes["new"] = (out / row.image).read_bytes()
            time.sleep(0.3)  # queries keep hitting the old index, now moved aside
            answer = httpx.post(f"{url}/admin/reload", timeout=60).json()
            time.sleep(0.3)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        assert answer["index_version"] != answer["previous_version"]

    assert problems == []
    assert counts[0] > 20
    # Both indexes answered, and each answer's pages came from the index its header names.
    assert seen == {answer["previous_version"]: {page_bytes["old"]},
                    answer["index_version"]: {page_bytes["new"]}}
    assert page_bytes["old"] != page_bytes["new"]


def test_reload_of_a_broken_index_keeps_serving_the_current_one(sample_index, tmp_path):
    client = TestClient(create_app(sample_index, api_key="k"))
    assert client.post("/admin/reload").status_code == 401
    r = client.post("/admin/reload", json={"index": str(tmp_path)}, headers={"X-API-Key": "k"})
    assert r.status_code == 409 and "still serving" in r.json()["detail"]
    ok = client.post("/batch_fetch", json={"query": ["text, 1"], "id": ["annual_report"]},
                     headers={"X-API-Key": "k"})
    assert ok.status_code == 200 and ok.json()[0]["id"] == "text, 1"


# --------------------------------------------------------------------------- kill -9


def _run_child(point: str, out: Path, sources, kill_after_s: float | None = None) -> int:
    proc = subprocess.Popen([sys.executable, str(CHILD), point, str(out), *map(str, sources)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=kill_after_s if kill_after_s is not None else 120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=30)


@pytest.fixture(scope="module")
def old_index_template(sample_pdfs, tmp_path_factory):
    # The index being replaced has two documents; the new one has three.
    return build_index(sample_pdfs[:2], tmp_path_factory.mktemp("old") / "idx", progress=False)


def _fresh_old_index(template: Path, parent: Path) -> Path:
    import shutil

    out = parent / "idx"
    shutil.copytree(template, out)
    return out


def _assert_servable(out: Path, old_docs: list[str], new_docs: list[str]) -> str:
    """Start-up (recovery included) serves the old or the new index, whole; returns which."""
    client = TestClient(create_app(out))
    docs = [d["doc_id"] for d in client.get("/documents").json()["documents"]]
    assert docs in (old_docs, new_docs)
    r = client.post("/batch_search", json={"query": ["padlock"], "id": ["safety_manual"], "top_n": 1})
    assert r.json()[0][0]["id"] == "safety_manual_2"
    every_page = {"query": [f"image, {p}" for d in docs for p in range(1, PageStore.open(out).documents()[d] + 1)],
                  "id": [d for d in docs for _ in range(PageStore.open(out).documents()[d])]}
    assert all(item["id"] != "error" for item in client.post("/batch_fetch", json=every_page).json())
    del client
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name != "idx")
    assert leftovers == []  # dead builds and old copies were cleaned up
    return "old" if docs == old_docs else "new"


@pytest.mark.parametrize("point", ["rename-before-1", "rename-after-1", "rename-after-2",
                                   "manifest-half", "rmtree-half"])
def test_kill_9_at_each_step_of_a_swap_leaves_a_servable_index(point, old_index_template,
                                                                 sample_pdfs, tmp_path):
    out = _fresh_old_index(old_index_template, tmp_path)
    old_docs = list(PageStore.open(out).documents())
    assert _run_child(point, out, sample_pdfs) == -9
    got = _assert_servable(out, old_docs, ["annual_report", "safety_manual", "product_guide"])
    # Before the old index moved aside, the old one stays; once the new one is complete and
    # the swap has begun, recovery finishes it.
    assert got == {"rename-before-1": "old", "manifest-half": "old"}.get(point, "new")


@pytest.fixture(scope="module")
def reindex_seconds(old_index_template, sample_pdfs, tmp_path_factory):
    """How long an uninterrupted re-index child runs here (start-up included)."""
    out = _fresh_old_index(old_index_template, tmp_path_factory.mktemp("timing"))
    start = time.monotonic()
    assert _run_child("none", out, sample_pdfs) == 0
    return time.monotonic() - start


@pytest.mark.parametrize("seed", range(6))
def test_kill_9_at_random_moments_leaves_a_servable_index(seed, old_index_template, sample_pdfs,
                                                          reindex_seconds, tmp_path):
    out = _fresh_old_index(old_index_template, tmp_path)
    old_docs = list(PageStore.open(out).documents())
    delay = random.Random(seed).uniform(0.05, reindex_seconds)  # anywhere in the child's life
    _run_child("none", out, sample_pdfs, kill_after_s=delay)
    _assert_servable(out, old_docs, ["annual_report", "safety_manual", "product_guide"])


def test_a_following_server_picks_up_a_reindex_by_itself(sample_pdfs, tmp_path):
    out = tmp_path / "idx"
    build_index(sample_pdfs[:2], out, progress=False)
    client = TestClient(create_app(out, follow_index_s=0.05))
    body = {"query": ["text, 1"], "id": ["annual_report"]}
    first = client.post("/batch_fetch", json=body)
    assert first.status_code == 200
    build_index(sample_pdfs, out, progress=False)  # a third document appears
    deadline = time.monotonic() + 30
    while client.post("/batch_fetch", json=body).headers["X-Index-Version"] == first.headers["X-Index-Version"]:
        assert time.monotonic() < deadline, "the server never followed the re-index"
        time.sleep(0.05)
    assert [d["doc_id"] for d in client.get("/documents").json()["documents"]][-1] == "product_guide"
    assert client.get("/metrics").text.count("vrag_retriever_index_loads_total 2.0") == 1
