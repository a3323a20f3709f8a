"""A file that cannot be read does not stop `vrag-retriever index` (issue 48, item 7).

Indexing skips a corrupt PDF or an unreadable page image, goes on, names each skipped file with
its reason at the end and records it in the manifest (``skipped``); it exits 2, writing nothing,
only when nothing could be indexed. ``--unreadable fail`` stops at the first one instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from PIL import Image

from retriever_server.cli import main
from retriever_server.indexing.indexer import build_index
from retriever_server.storage.manifest import MANIFEST_NAME, read_manifest
from retriever_server.storage.store import PageStore

SMALL = ["--max-pixels", str(128 * 28 * 28), "--min-pixels", str(64 * 28 * 28), "--ocr", "off"]


def run(argv: list[str]) -> int:
    """`vrag-retriever ARGV` in this process: its exit status."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def corrupt_pdf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)  # a PDF header, then garbage
    return path


def folder_of(tmp_path: Path, *pdfs: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for pdf in pdfs:
        shutil.copy(pdf, folder / pdf.name)
    return folder


def test_a_corrupt_pdf_beside_good_ones_is_skipped_and_reported(sample_pdfs, tmp_path, capsys):
    docs = folder_of(tmp_path, sample_pdfs[0], sample_pdfs[2])
    bad = corrupt_pdf(docs / "broken.pdf")
    out = tmp_path / "idx"
    assert run(["index", str(docs), "--out", str(out), *SMALL]) == 0
    captured = capsys.readouterr()
    assert "indexed 2 document(s), 8 page(s)" in captured.out, captured.out
    assert "skipped 1 file(s)" in captured.out
    lines = captured.err.splitlines()
    assert f"vrag-retriever index: skipped {bad}: cannot open PDF (" in captured.err, captured.err
    assert sum(str(bad) in line for line in lines) == 1  # named once, on one line
    assert "Traceback" not in captured.err
    store = PageStore.open(out)
    assert sorted(store.documents()) == ["annual_report", "product_guide"]
    (skipped,) = store.manifest.skipped
    assert skipped["source"] == str(bad) and skipped["reason"].startswith("cannot open PDF")


def test_an_unreadable_page_image_skips_its_folder_and_the_rest_keep_their_pages(sample_pdfs, tmp_path,
                                                                                   capsys):
    """The failure surfaces while pages are written (the folder's page count was known), so the
    documents after it move down: their pages must still be their own."""
    docs = tmp_path / "docs"
    deck = docs / "a_deck"
    deck.mkdir(parents=True)
    for n in (1, 2, 3):
        Image.new("RGB", (96, 72), (60 * n, 90, 30)).save(deck / f"slide_{n}.png")
    good = (deck / "slide_2.png").read_bytes()
    (deck / "slide_2.png").write_bytes(good[: len(good) // 2])  # truncated in the middle
    shutil.copy(sample_pdfs[2], docs / sample_pdfs[2].name)
    out = build_index([docs], tmp_path / "idx", progress=False, ocr="off")
    alone = build_index([sample_pdfs[2]], tmp_path / "alone", progress=False, ocr="off")
    manifest = read_manifest(out)
    assert [d.doc_id for d in manifest.docs] == ["product_guide"]
    assert manifest.docs[0].first_row == 0
    (skipped,) = manifest.skipped
    assert skipped["source"] == str(deck) and "slide_2.png" in skipped["reason"], skipped
    # every page is the one a clean build of that document writes, and nothing else is left
    store, clean = PageStore.open(out), PageStore.open(alone)
    for page in range(1, 5):
        assert store.page_image("product_guide", page).jpeg == clean.page_image("product_guide", page).jpeg
    assert len(list((out / "pages").iterdir())) == len(manifest.pages) == 4
    assert len(list((out / "sources").iterdir())) == 1


def test_nothing_readable_exits_2_and_leaves_the_index_as_it_was(sample_pdfs, tmp_path, capsys):
    out = tmp_path / "idx"
    assert run(["index", str(sample_pdfs[2]), "--out", str(out), *SMALL]) == 0
    before = (out / MANIFEST_NAME).read_text()
    docs = tmp_path / "docs"
    corrupt_pdf(docs / "one.pdf")
    corrupt_pdf(docs / "two.pdf")
    capsys.readouterr()
    assert run(["index", str(docs), "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vrag-retriever index: error: nothing could be indexed"), err
    assert "one.pdf: cannot open PDF" in err and "two.pdf: cannot open PDF" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (out / MANIFEST_NAME).read_text() == before


def test_unreadable_fail_stops_at_the_first_and_writes_nothing(sample_pdfs, tmp_path, capsys):
    docs = folder_of(tmp_path, sample_pdfs[2])
    bad = corrupt_pdf(docs / "broken.pdf")
    out = tmp_path / "idx"
    assert run(["index", str(docs), "--out", str(out), "--unreadable", "fail", *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vrag-retriever index: error: {bad}: cannot open PDF ("), err
    assert "--unreadable skip" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_the_skipped_list_round_trips_and_older_manifests_have_none(sample_index, tmp_path):
    assert read_manifest(sample_index).skipped == []
    raw = json.loads((sample_index / MANIFEST_NAME).read_text())
    assert "skipped" not in raw  # an index with nothing skipped is written as before
    copy = tmp_path / "idx"
    copy.mkdir()
    raw["skipped"] = [{"source": "/x/broken.pdf", "reason": "cannot open PDF (Data format error)"}]
    (copy / MANIFEST_NAME).write_text(json.dumps(raw))
    assert read_manifest(copy).skipped == raw["skipped"]


def test_an_encrypted_pdf_is_skipped_saying_so(sample_pdfs, tmp_path):
    from reportlab.pdfgen import canvas

    docs = folder_of(tmp_path, sample_pdfs[2])
    locked = canvas.Canvas(str(docs / "locked.pdf"), encrypt="secret")
    locked.drawString(72, 720, "a page behind a password")
    locked.showPage()
    locked.save()
    out = build_index([docs], tmp_path / "idx", progress=False, ocr="off")
    (skipped,) = read_manifest(out).skipped
    assert skipped["source"] == str(docs / "locked.pdf") and "password" in skipped["reason"], skipped


def test_the_option_is_explained(capsys):
    assert run(["index", "--help"]) == 0
    assert "--unreadable {skip,fail}" in capsys.readouterr().out
