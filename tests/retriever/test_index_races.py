"""Races between loading, swapping, collecting and following an index, each forced with a hook at
the exact bad moment (no sleeps): a loader never serves a mix of two indexes or a deleted one; a
collect never deletes a build being created, nor fails on one its builder deletes; a re-index
is followed by exactly one reload; a hybrid (BM25 + Qdrant) index is versioned by its content and
followed like a BM25 one; a reload is reported as what it did."""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import types
from pathlib import Path

import bm25s
import pytest
from fastapi.testclient import TestClient

from retriever_server.api.app import create_app
from retriever_server.backends import open_backend, qdrant
from retriever_server.indexing.indexer import build_index
from retriever_server.sample_corpus import SAMPLE_FACTS
from retriever_server.serving import lifecycle
from retriever_server.serving.lifecycle import IndexSlot, index_version
from retriever_server.serving.limits import Limits
from retriever_server.storage import swap
from retriever_server.storage.store import PageStore

from .dense_support import dense_index, tiny_colqwen2

QUERIES = list(SAMPLE_FACTS)
SEARCH = {"query": QUERIES, "id": [SAMPLE_FACTS[q][0] for q in QUERIES], "top_n": 1}
WANT = [f"{d}_{p}" for d, p in SAMPLE_FACTS.values()]
_Thread = threading.Thread


def _held_exclusively(directory: Path) -> bool:
    """True when someone holds an exclusive flock on ``directory`` (a swap, recover or collect)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def reordered_index(sample_pdfs, tmp_path_factory):
    """The same pages as a default build, documents in reverse order: every row number differs."""
    return build_index(list(reversed(sample_pdfs)), tmp_path_factory.mktemp("rev") / "idx",
                       progress=False)


def _swap_in_later(template: Path, out: Path):
    """A complete build of ``template`` beside ``out``, claimed as its builder does; the function
    returned swaps it in (what ``build_index`` does last)."""
    build, claim = swap.new_build_dir(out)
    shutil.copytree(template, build, dirs_exist_ok=True)

    def swap_it_in() -> None:
        try:
            swap.swap_in(build, out)
        finally:
            os.close(claim)

    return swap_it_in


def test_a_swap_during_a_load_never_serves_a_mixed_index(sample_pdfs, reordered_index, tmp_path,
                                                         monkeypatch):
    out = build_index(sample_pdfs, tmp_path / "idx", progress=False)
    reindex = _swap_in_later(reordered_index, out)
    real_load = bm25s.BM25.load
    swapped = []

    def swap_then_load(*args, **kwargs):
        # A re-index finishes just after the loader opened the directory and read its manifest.
        if not swapped:
            swapped.append(True)
            reindex()
        return real_load(*args, **kwargs)

    monkeypatch.setattr(bm25s.BM25, "load", swap_then_load)
    client = TestClient(create_app(out))
    assert swapped
    r = client.post("/batch_search", json=SEARCH)
    assert r.status_code == 200
    assert [hits[0]["id"] for hits in r.json()] == WANT
    monkeypatch.undo()
    # Loaded whole: the index the path names now, under its own version.
    assert r.headers["X-Index-Version"] == index_version(open_backend(out))


def test_a_directory_deleted_between_open_and_lock_is_not_served(sample_pdfs, reordered_index,
                                                                 tmp_path, monkeypatch):
    out = build_index(sample_pdfs, tmp_path / "idx", progress=False)
    reindex = _swap_in_later(reordered_index, out)
    real_flock = fcntl.flock
    swapped = []

    def swap_then_flock(fd, operation):
        # The loader has opened the directory but holds no lock on it yet: a swap moves it
        # aside and, seeing nobody holding it, deletes it.
        if operation == fcntl.LOCK_SH and not swapped:
            swapped.append(True)
            reindex()
        return real_flock(fd, operation)

    monkeypatch.setattr(swap.fcntl, "flock", swap_then_flock)
    store = PageStore.open(out)
    monkeypatch.undo()
    assert swapped
    assert list(store.documents()) == list(PageStore.open(reordered_index).documents())
    first = store.entry_at(0)
    assert len(store.page_image(first.doc_id, first.page).jpeg) == first.bytes


def test_a_collect_never_deletes_a_build_being_created(tmp_path, monkeypatch):
    out = tmp_path / "idx"
    real_mkdtemp = tempfile.mkdtemp
    made: list[str] = []
    collectors: list[threading.Thread] = []

    def mkdtemp_then_collect(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        # Another process's swap, recover or reload collects leftovers right now. If the builder
        # holds the parent lock, that collect waits for it (run it beside us); else it runs now.
        if _held_exclusively(tmp_path):
            collectors.append(_Thread(target=swap.collect, args=(out,)))
            collectors[-1].start()
        else:
            swap.collect(out)
        return made[-1]

    monkeypatch.setattr(swap.tempfile, "mkdtemp", mkdtemp_then_collect)
    try:
        build, claim = swap.new_build_dir(out)
    except FileNotFoundError:  # the claim came too late: the directory was gone
        build, claim = Path(made[0]), None
    monkeypatch.undo()
    for collector in collectors:  # it ran once the builder had claimed its directory
        collector.join(timeout=30)
        assert not collector.is_alive()
    try:
        assert build.is_dir(), "a collect deleted a build before its builder claimed it"
    finally:
        if claim is not None:
            os.close(claim)


def test_a_build_deleted_while_a_collect_lists_it_does_not_fail_the_collect(tmp_path,
                                                                             monkeypatch):
    out = tmp_path / "idx"
    failed, claim = swap.new_build_dir(out)  # a builder whose build failed...
    real_stat, deleted = Path.stat, []

    def stat_while_builder_cleans_up(self, **kwargs):
        answer = real_stat(self, **kwargs)
        if self == failed and not deleted:  # ...deletes it (its own: no parent lock) just
            deleted.append(True)             # after the collect first looked at it
            shutil.rmtree(failed)
        return answer

    monkeypatch.setattr(Path, "stat", stat_while_builder_cleans_up)
    try:
        swap.collect(out)
    except FileNotFoundError as exc:
        pytest.fail(f"collect failed on a vanished build: {exc}")
    finally:
        os.close(claim)
    assert deleted and not failed.exists()


def test_a_reload_that_switched_is_reported_even_if_cleaning_up_fails(sample_pdfs, tmp_path,
                                                                      monkeypatch):
    out = build_index(sample_pdfs[:2], tmp_path / "idx", progress=False)
    client = TestClient(create_app(out))
    build_index(sample_pdfs, out, progress=False)

    def collect_fails(path):
        raise PermissionError(f"cannot delete old copies beside {path}")

    monkeypatch.setattr(lifecycle, "collect", collect_fails)
    r = client.post("/admin/reload")
    assert r.status_code == 200, r.text  # not "409 still serving" the index it switched away from
    assert r.json()["documents"] == 3
    assert client.get("/health").json()["documents"] == 3


def test_follow_reloads_once_however_many_checks_see_a_reindex(sample_pdfs, tmp_path,
                                                               monkeypatch):
    out = build_index(sample_pdfs[:2], tmp_path / "idx", progress=False)
    loads = []
    slot = IndexSlot(out, limits=Limits(), cache_bytes=1 << 20, preload=False, follow_s=0.0,
                     on_load=loads.append)
    build_index(sample_pdfs, out, progress=False)  # the path now names another directory
    pending: list[threading.Thread] = []

    class NotYetStarted(_Thread):
        def start(self):  # the reload thread is slow to start: a second check comes first
            pending.append(self)

    monkeypatch.setattr(lifecycle, "threading", types.SimpleNamespace(Thread=NotYetStarted))
    slot.follow()
    slot.follow()
    monkeypatch.undo()
    assert pending
    for thread in pending:
        thread.run()
    assert len(loads) == 2 and loads[1].documents == 3
    assert slot.current is loads[1]


# --------------------------------------------------------------------------- hybrid


def _join_follow_threads() -> None:
    for thread in threading.enumerate():
        if thread.name == "index-follow":
            thread.join(timeout=120)


@pytest.fixture(scope="module")
def hybrid_builds(tmp_path_factory):
    """Two hybrid builds of the same documents, the second with other JPEG settings."""
    base = tmp_path_factory.getbasetemp()
    template = dense_index(base, search="hybrid")
    own = tmp_path_factory.mktemp("hybrid")
    first = shutil.copytree(template, own / "q80")  # local mode: one client per folder
    other = build_index(sorted((base / "corpus-hybrid").glob("*.pdf")), own / "q40",
                        progress=False, encoder=f"colqwen2:{tiny_colqwen2(base)}", search="hybrid",
                        min_pixels=64 * 28 * 28, max_pixels=128 * 28 * 28, jpeg_quality=40)
    return first, other


@pytest.mark.process
def test_hybrid_version_changes_with_the_content(hybrid_builds):
    first, second = (open_backend(index) for index in hybrid_builds)
    try:
        assert first.documents() == second.documents()  # same documents, other page images
        assert index_version(first) != index_version(second)
    finally:
        first.close()
        second.close()


@pytest.mark.process
def test_a_swap_during_a_hybrid_load_is_not_served_half_swapped(hybrid_builds, tmp_path,
                                                                 monkeypatch):
    first, second = hybrid_builds
    out = shutil.copytree(first, tmp_path / "idx")
    reindex = _swap_in_later(second, out)
    real_connect = qdrant.connect
    swapped = []

    def swap_then_connect(location, index_dir):
        # A re-index finishes after the manifest was read, before the vectors are opened.
        if not swapped:
            swapped.append(True)
            reindex()
        return real_connect(location, index_dir)

    monkeypatch.setattr(qdrant, "connect", swap_then_connect)
    client = TestClient(create_app(out))
    monkeypatch.undo()
    assert swapped
    fetched = client.post("/batch_fetch", json={"query": ["image, 1"], "id": ["annual_report"]})
    row = PageStore.open(second).entry("annual_report", 1)
    assert fetched.headers["X-Index-Version"] == _version_of(second)
    assert base64.b64decode(fetched.json()[0]["contents"]) == (second / row.image).read_bytes()


def _version_of(index: Path) -> str:
    backend = open_backend(index)
    try:
        return index_version(backend)
    finally:
        backend.close()


@pytest.mark.process
def test_a_following_hybrid_server_reloads_once_per_reindex(hybrid_builds, tmp_path, caplog):
    first, second = hybrid_builds
    out = shutil.copytree(first, tmp_path / "idx")
    client = TestClient(create_app(out, follow_index_s=0.0))  # check on every request
    body = {"query": ["text, 1"], "id": ["annual_report"]}

    def versions(requests: int) -> list[str]:
        seen = []
        for _ in range(requests):
            seen.append(client.post("/batch_fetch", json=body).headers["X-Index-Version"])
            _join_follow_threads()  # a reload the request started is done before the next one
        return seen

    with caplog.at_level(logging.ERROR, logger=lifecycle.__name__):
        before = versions(3)
        assert [r.getMessage() for r in caplog.records] == []  # nothing changed: no reload
        _swap_in_later(second, out)()  # a re-index
        after = versions(3)
    assert [r.getMessage() for r in caplog.records] == []
    assert len(set(before)) == 1 and after[0] == before[0]  # answered by the loaded index...
    assert after[1] == after[2] != before[0]  # ...until the reload it started switched
    assert "vrag_retriever_index_loads_total 2.0" in client.get("/metrics").text


@pytest.mark.process
def test_reloading_the_unchanged_hybrid_directory_is_refused_cleanly(hybrid_builds, tmp_path):
    out = shutil.copytree(hybrid_builds[0], tmp_path / "idx")
    client = TestClient(create_app(out), raise_server_exceptions=False)
    version = client.get("/ready").json()["index_version"]
    r = client.post("/admin/reload")  # nothing was re-indexed: Qdrant's folder is ours already
    assert r.status_code == 409, r.text
    assert "still serving" in r.json()["detail"] and "re-index first" in r.json()["detail"]
    assert client.get("/ready").json()["index_version"] == version
