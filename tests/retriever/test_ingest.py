import io

import pypdfium2 as pdfium
import pytest
from PIL import Image

from retriever_server.backends import open_backend
from retriever_server.indexing import ocr as ocr_mod
from retriever_server.indexing.indexer import build_index
from retriever_server.indexing.ingest import OcrPolicy, discover, iter_pages
from retriever_server.storage.store import PageStore

needs_tesseract = pytest.mark.skipif(ocr_mod.tesseract_path() is None,
                                     reason="tesseract is not installed (apt-get install tesseract-ocr)")


def _render_pages(pdf_path, folder, names, scale=2.0):
    """Write pages of a PDF as plain images (no text layer), like a scanned document."""
    folder.mkdir(parents=True)
    pdf = pdfium.PdfDocument(pdf_path)
    for index, name in enumerate(names):
        pdf[index].render(scale=scale).to_pil().convert("RGB").save(folder / name)
    pdf.close()
    return folder


def test_pdf_text_layer(sample_pdfs):
    doc = discover([sample_pdfs[1]])[0]
    assert (doc.doc_id, doc.kind) == ("safety_manual", "pdf")
    pages = list(iter_pages(doc, min_pixels=256 * 28 * 28, max_pixels=512 * 28 * 28,
                            jpeg_quality=75, ocr=OcrPolicy("off")))
    assert [p.page for p in pages] == [1, 2, 3, 4, 5]
    assert "Lockout/Tagout Procedure" in pages[1].text
    assert all(p.text_source == "pdf" for p in pages)
    for p in pages:
        image = Image.open(io.BytesIO(p.jpeg))
        assert image.format == "JPEG" and image.size == (p.width, p.height)
        assert 256 * 28 * 28 <= p.width * p.height <= 512 * 28 * 28


def test_image_folder_is_one_document_in_natural_order(sample_pdfs, tmp_path):
    names = ["scan_1.png", "scan_2.png", "scan_10.png"]  # scan_10 must come last
    folder = _render_pages(sample_pdfs[0], tmp_path / "scanned_report", names)
    out = build_index([folder], tmp_path / "idx", ocr="off", progress=False)
    store = PageStore.open(out)
    assert dict(store.documents()) == {"scanned_report": 3}
    assert store.entry("scanned_report", 3).text_source == "none"
    # Page 3 is scan_10.png, which holds the PDF's third page.
    original = Image.open(folder / "scan_10.png")
    stored = Image.open(io.BytesIO(store.page_image("scanned_report", 3).jpeg))
    assert stored.width / stored.height == pytest.approx(original.width / original.height, rel=0.05)


def test_folders_of_pdfs_and_nested_image_folders(sample_pdfs, tmp_path):
    lib = tmp_path / "library"
    lib.mkdir()
    for pdf in sample_pdfs[:2]:
        (lib / pdf.name).write_bytes(pdf.read_bytes())
    _render_pages(sample_pdfs[2], lib / "guide_scan", ["p1.png"])
    docs = discover([lib])
    assert sorted((d.doc_id, d.kind) for d in docs) == [
        ("annual_report", "pdf"), ("guide_scan", "images"), ("safety_manual", "pdf")]


def test_discover_rejects_bad_sources(sample_pdfs, tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        discover([tmp_path / "missing.pdf"])
    text_file = tmp_path / "notes.txt"
    text_file.write_text("hello")
    with pytest.raises(ValueError, match="not a PDF"):
        discover([text_file])
    with pytest.raises(ValueError, match="duplicate doc id"):
        copy = tmp_path / "other" / sample_pdfs[0].name
        copy.parent.mkdir()
        copy.write_bytes(sample_pdfs[0].read_bytes())
        discover([sample_pdfs[0], copy])
    with pytest.raises(ValueError, match="no documents"):
        (tmp_path / "empty").mkdir()
        discover([tmp_path / "empty"])


def test_corrupt_pdf_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.4 not really a pdf")
    with pytest.raises(ValueError, match="broken.pdf"):
        build_index([bad], tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx").exists()


def test_missing_tesseract_gives_one_line_notice(sample_pdfs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ocr_mod, "tesseract_path", lambda: None)
    folder = _render_pages(sample_pdfs[1], tmp_path / "scans", ["a.png", "b.png"], scale=1.0)
    build_index([folder], tmp_path / "idx", ocr="auto", progress=False)
    notices = [line for line in capsys.readouterr().err.splitlines() if "tesseract" in line]
    assert len(notices) == 1 and "2 page(s)" in notices[0]
    with pytest.raises(RuntimeError, match="tesseract"):
        build_index([folder], tmp_path / "idx2", ocr="on", progress=False)


@needs_tesseract
@pytest.mark.process  # tesseract
def test_ocr_reads_scanned_pages(sample_pdfs, tmp_path):
    folder = _render_pages(sample_pdfs[1], tmp_path / "scanned_manual", ["1.png", "2.png"])
    out = build_index([folder], tmp_path / "idx", ocr="auto", progress=False)
    store = PageStore.open(out)
    entry = store.entry("scanned_manual", 2)
    assert entry.text_source == "ocr"
    assert "padlock" in entry.text.lower()
    hits = open_backend(out).search(["lockout tagout padlock"], ["scanned_manual"], 1)
    assert hits[0][0].page == 2
