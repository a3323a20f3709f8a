import json

import pytest

from retriever_server.backends import open_backend
from retriever_server.indexing import indexer
from retriever_server.sample_corpus import SAMPLE_FACTS
from retriever_server.storage.manifest import FORMAT_VERSION, MANIFEST_NAME, read_manifest
from retriever_server.storage.store import PageStore


def _answers(index_dir):
    backend = open_backend(index_dir)
    queries = list(SAMPLE_FACTS)
    hits = backend.search(queries, [SAMPLE_FACTS[q][0] for q in queries], 4)
    return [[(h.doc_id, h.page, round(h.score, 6)) for h in row] for row in hits]


def test_manifest_describes_every_page(sample_index):
    manifest = read_manifest(sample_index)
    assert manifest.format_version == FORMAT_VERSION
    assert [(d.doc_id, d.num_pages) for d in manifest.docs] == [
        ("annual_report", 4), ("safety_manual", 5), ("product_guide", 4)]
    assert manifest.backend["kind"] == "bm25"
    for entry in manifest.pages:
        path = sample_index / entry.image
        assert path.stat().st_size == entry.bytes > 0
        assert 512 * 28 * 28 <= entry.width * entry.height <= 1280 * 28 * 28
        assert entry.text.strip()


def test_reopened_index_gives_identical_answers(sample_index, sample_pdfs, tmp_path):
    first = _answers(sample_index)
    assert first == _answers(sample_index)
    # An index built again from the same sources answers the same as well.
    rebuilt = indexer.build_index(sample_pdfs, tmp_path / "again", progress=False)
    assert _answers(rebuilt) == first


def test_reindex_swaps_in_a_new_index(sample_pdfs, tmp_path):
    out = tmp_path / "idx"
    indexer.build_index(sample_pdfs[:1], out, progress=False)
    assert list(PageStore.open(out).documents()) == ["annual_report"]
    indexer.build_index(sample_pdfs, out, progress=False)
    assert list(PageStore.open(out).documents()) == ["annual_report", "safety_manual", "product_guide"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no temp or old dirs left


def test_failed_build_leaves_old_index_untouched(sample_pdfs, tmp_path, monkeypatch):
    out = tmp_path / "idx"
    indexer.build_index(sample_pdfs[:1], out, progress=False)
    before = (out / MANIFEST_NAME).read_bytes()

    def explode(*args, **kwargs):
        yield from ()
        raise OSError("disk full")

    monkeypatch.setattr(indexer, "iter_pages", explode)
    with pytest.raises(OSError, match="disk full"):
        indexer.build_index(sample_pdfs, out, progress=False)
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


def test_refuses_to_replace_a_non_index_directory(sample_pdfs, tmp_path):
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "cat.jpg").write_bytes(b"...")
    with pytest.raises(FileExistsError):
        indexer.build_index(sample_pdfs, precious, progress=False)
    assert (precious / "cat.jpg").exists()


def test_store_refuses_manifest_with_path_traversal(sample_index, tmp_path):
    data = json.loads((sample_index / MANIFEST_NAME).read_text())
    data["pages"][0]["image"] = "../../etc/passwd"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="refusing image name"):
        PageStore.open(bad)


def test_store_refuses_other_format_versions(sample_index, tmp_path):
    data = json.loads((sample_index / MANIFEST_NAME).read_text())
    data["format_version"] = FORMAT_VERSION + 1
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not supported"):
        PageStore.open(tmp_path)
    with pytest.raises(FileNotFoundError):
        PageStore.open(tmp_path / "nowhere")


def test_worker_processes_give_the_same_index(sample_pdfs, sample_index, tmp_path):
    parallel = indexer.build_index(sample_pdfs, tmp_path / "par", progress=False, workers=2)
    assert read_manifest(parallel).pages == read_manifest(sample_index).pages
    for entry in read_manifest(parallel).pages[:3]:
        assert (parallel / entry.image).read_bytes() == (sample_index / entry.image).read_bytes()


def test_restarted_server_answers_byte_for_byte_the_same(sample_index):
    from fastapi.testclient import TestClient

    from retriever_server.api.app import create_app

    queries = list(SAMPLE_FACTS)
    body = {"query": queries, "id": [SAMPLE_FACTS[q][0] for q in queries], "top_n": 3,
            "return_score": True}
    fetch = {"query": ["image, 2", "text, 3"], "id": ["safety_manual", "annual_report"]}
    answers = []
    for _ in range(2):  # two independent app instances over the same directory
        c = TestClient(create_app(sample_index))
        answers.append((c.post("/batch_search", json=body).content,
                        c.post("/batch_fetch", json=fetch).content))
    assert answers[0] == answers[1]
    assert len(answers[0][0]) > 100_000  # real images, not an empty answer


def test_server_never_serves_pages_of_a_swapped_in_index(sample_pdfs, tmp_path):
    import base64

    from fastapi.testclient import TestClient

    from retriever_server.api.app import create_app

    out = tmp_path / "idx"
    indexer.build_index(sample_pdfs, out, progress=False)
    old_page = (out / read_manifest(out).pages[0].image).read_bytes()  # annual_report page 1
    client = TestClient(create_app(out))  # images load lazily, on first use
    body = {"query": ["padlock", "Lisbon"], "id": ["safety_manual", "annual_report"], "top_n": 1}
    first = client.post("/batch_search", json={**body, "query": ["padlock"], "id": ["safety_manual"]})
    assert first.json()[0][0]["id"] == "safety_manual_2"
    version = first.headers["X-Index-Version"]
    # Re-index with other settings: same names, different images.
    indexer.build_index(sample_pdfs, out, progress=False, jpeg_quality=40)
    r = client.post("/batch_search", json=body)
    assert r.status_code == 200 and r.headers["X-Index-Version"] == version
    cached, uncached = r.json()
    assert cached[0]["id"] == "safety_manual_2"  # already in memory: still the old, consistent page
    # Not cached yet: read from the old directory, which the swap left in place for this server.
    assert uncached[0]["id"] == "annual_report_1"
    assert base64.b64decode(uncached[0]["contents"]) == old_page
    assert (out / read_manifest(out).pages[0].image).read_bytes() != old_page
    # After a reload the server answers from the new index, and the old directory goes away.
    reloaded = client.post("/admin/reload").json()
    assert reloaded["previous_version"] == version != reloaded["index_version"]
    r = client.post("/batch_search", json=body)
    assert r.headers["X-Index-Version"] == reloaded["index_version"]
    assert base64.b64decode(r.json()[1][0]["contents"]) != old_page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
