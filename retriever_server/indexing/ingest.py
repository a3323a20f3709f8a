"""Turn sources (PDFs, folders of PDFs, folders of page images) into pages.

Discovery decides what the documents are (doc id = file stem or folder name); page extraction
reads one document and yields, per 1-based page, its text and its JPEG bytes at the stored size,
plus the page's role (``roles``) and heading lines (``headings``, from font sizes in the text layer).

Pages are numbered by position (1..n), for PDFs and image folders alike. An image folder whose
file names number its images (``image_numbers``: SlideVQA's ``<deck>-<slide>-<width>.jpg``,
``slide_3.png``) also records each image's own number (``IngestedPage.source_number``), so that a
missing image (a slide that failed to download) can be told apart from a renumbered one: gold
pages written as slide numbers are mapped through it (``vrag_rollout.data.dataset``).

A document that cannot be read (a PDF pdfium cannot open or render, an image PIL cannot decode)
raises ``UnreadableDocument``, and nothing else does: the indexer skips exactly those
(``unreadable``), while a bad setting or a bug still stops the build.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image

from ..storage.imaging import DEFAULT_DPI, center_window, encode_jpeg, fit_to_budget, render_scale
from . import headings as headings_mod
from . import ocr as ocr_mod
from . import roles as roles_mod
from .layout import page_lines

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif"})
OCR_MODES = ("auto", "on", "off")
# Resolution of the extra render used only as OCR input (tesseract wants ~200-300 dpi).
OCR_DPI = 200


class UnreadableDocument(ValueError):
    """The file at ``path`` cannot be read as a document, for ``reason`` (said without the path)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason

    def __reduce__(self):  # raised in ingest worker processes too
        return type(self), (self.path, self.reason)


# What PIL raises for a file it cannot decode (truncated, not an image, a decompression bomb).
_IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


@dataclass(frozen=True)
class DocSource:
    doc_id: str
    kind: str  # "pdf" or "images"
    path: Path
    image_paths: tuple[Path, ...] = field(default=())
    # Each image's own number from its file name (``image_numbers``); None: not numbered.
    numbers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class IngestedPage:
    page: int  # 1-based
    text: str
    text_source: str  # "pdf", "ocr" or "none"
    jpeg: bytes
    width: int
    height: int
    role: str = roles_mod.BODY
    headings: tuple[str, ...] = ()
    source_number: int | None = None  # the image's own number (``image_numbers``), else None


def describe(lines: list[headings_mod.Line], page: int, num_pages: int) -> tuple[str, tuple[str, ...]]:
    """A page's role and headings; contents and index pages have entries, not headings."""
    role = roles_mod.classify([line.text for line in lines], page, num_pages)
    if role in (roles_mod.CONTENTS, roles_mod.INDEX):
        return role, ()
    return role, headings_mod.detect(lines)


def _plain_lines(text: str) -> list[headings_mod.Line]:
    """Lines of text without font data (OCR output)."""
    return [headings_mod.Line(line) for line in text.splitlines()]


def _natural_key(path: Path) -> list:
    # page_2 sorts before page_10.
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


def _images_in(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                  key=_natural_key)


def image_numbers(paths: list[Path] | tuple[Path, ...]) -> tuple[int, ...] | None:
    """Each image's own number, read from its file name, when a folder's images are numbered;
    else None (the folder is paged by position alone, as before).

    The images are numbered when their names (suffix aside, case ignored) are the same text
    around the same count of numbers and exactly one of those numbers differs between them
    (SlideVQA's ``<deck>-<slide>-<width>.jpg``, where the deck name may hold digits too;
    ``slide_3.png``; ``p10.png``), each image's value distinct. A lone image is numbered when its
    name holds exactly one number. Names of other shapes, or with two numbers that both vary,
    are not numbered: nothing is guessed. ``paths`` are in natural order, so the numbers come
    out increasing.
    """
    parts = [re.split(r"(\d+)", path.stem.lower()) for path in paths]
    if not parts or len({tuple(p[0::2]) for p in parts}) != 1:
        return None
    values = [tuple(int(digits) for digits in p[1::2]) for p in parts]
    if not values[0]:
        return None
    if len(values) == 1:
        return values[0] if len(values[0]) == 1 else None
    varying = [i for i in range(len(values[0])) if len({v[i] for v in values}) > 1]
    if len(varying) != 1:
        return None
    own = tuple(v[varying[0]] for v in values)
    return own if len(set(own)) == len(own) else None


def _image_doc(doc_id: str, folder: Path, images: list[Path]) -> DocSource:
    return DocSource(doc_id, "images", folder, tuple(images), image_numbers(images))


def discover(sources: list[Path]) -> list[DocSource]:
    """Documents named by ``sources``; raises ValueError on a missing source or a duplicate doc id."""
    docs: list[DocSource] = []
    for src in map(Path, sources):
        if src.is_file():
            if src.suffix.lower() != ".pdf":
                raise ValueError(f"{src}: not a PDF; pass page images as a folder (one per document)")
            docs.append(DocSource(src.stem, "pdf", src))
        elif src.is_dir():
            images = _images_in(src)
            if images:
                docs.append(_image_doc(src.name, src, images))
            for child in sorted(src.iterdir(), key=_natural_key):
                if child.is_file() and child.suffix.lower() == ".pdf":
                    docs.append(DocSource(child.stem, "pdf", child))
                elif child.is_dir() and (child_images := _images_in(child)):
                    docs.append(_image_doc(child.name, child, child_images))
        else:
            raise ValueError(f"{src}: no such file or folder")
    seen: dict[str, Path] = {}
    for doc in docs:
        if doc.doc_id in seen:
            raise ValueError(f"duplicate doc id {doc.doc_id!r}: {seen[doc.doc_id]} and {doc.path}")
        seen[doc.doc_id] = doc.path
    if not docs:
        raise ValueError("no documents found (expected PDFs or folders of page images)")
    return docs


def count_pages(doc: DocSource) -> int:
    if doc.kind == "images":
        return len(doc.image_paths)
    pdf = _open_pdf(doc.path)
    try:
        return len(pdf)
    finally:
        pdf.close()


def _open_pdf(path: Path) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(path)
    except pdfium.PdfiumError as exc:
        raise UnreadableDocument(path, f"cannot open PDF ({str(exc).rstrip('.')})") from exc


@dataclass
class OcrPolicy:
    """Whether to OCR text-less pages; counts the pages it had to skip for the final notice."""

    mode: str = "auto"
    skipped: int = 0

    def __post_init__(self) -> None:
        if self.mode not in OCR_MODES:
            raise ValueError(f"ocr must be one of {OCR_MODES}, got {self.mode!r}")
        self.available = ocr_mod.tesseract_path() is not None
        if self.mode == "on" and not self.available:
            raise RuntimeError("ocr='on' but tesseract is not installed (apt-get install tesseract-ocr)")

    def wants(self, text: str) -> bool:
        if self.mode == "off" or not ocr_mod.needs_ocr(text):
            return False
        if not self.available:
            self.skipped += 1
            return False
        return True


def iter_pages(doc: DocSource, *, min_pixels: int, max_pixels: int, jpeg_quality: int,
               ocr: OcrPolicy, first: int = 1, last: int | None = None,
               dpi: float = DEFAULT_DPI) -> Iterator[IngestedPage]:
    """Pages ``first..last`` (1-based, inclusive; default all) of ``doc``.

    PDF pages are rendered at ``dpi`` and page images keep their resolution, then both are fitted
    into [min_pixels, max_pixels].
    """
    if doc.kind == "pdf":
        yield from _pdf_pages(doc.path, min_pixels, max_pixels, jpeg_quality, ocr, first, last, dpi)
    else:
        yield from _image_pages(doc.image_paths, doc.numbers, min_pixels, max_pixels,
                                jpeg_quality, ocr, first, last)


def _pdf_pages(path: Path, min_pixels: int, max_pixels: int, quality: int, ocr: OcrPolicy,
               first: int, last: int | None, dpi: float) -> Iterator[IngestedPage]:
    pdf = _open_pdf(path)
    try:
        stop = len(pdf) if last is None else min(last, len(pdf))
        for index in range(first - 1, stop):
            try:
                page = _pdf_page(path, pdf, index, min_pixels, max_pixels, quality, ocr, dpi)
            except pdfium.PdfiumError as exc:
                raise UnreadableDocument(path, f"cannot read page {index + 1} ({str(exc).rstrip('.')})") from exc
            yield page
    finally:
        pdf.close()


def _pdf_page(path: Path, pdf: pdfium.PdfDocument, index: int, min_pixels: int, max_pixels: int,
              quality: int, ocr: OcrPolicy, dpi: float) -> IngestedPage:
    page = pdf[index]
    textpage = page.get_textpage()
    text = textpage.get_text_range().replace("\r\n", "\n")
    lines = page_lines(textpage)
    textpage.close()
    width_pt, height_pt = page.get_size()  # as displayed: pdfium applies /Rotate
    if not (width_pt > 0 and height_pt > 0):
        raise UnreadableDocument(path, f"page {index + 1} has no area ({width_pt} x {height_pt} pt)")
    size = fit_to_budget(width_pt * dpi / 72, height_pt * dpi / 72, min_pixels, max_pixels)
    # Render at the stored size: the scale covers both sides, and the excess from
    # rounding to the 28-grid (under 28 px on one axis) is trimmed evenly from the two
    # margins, which is cheaper than resampling and keeps text sharp. (Crops map their
    # boxes through the same window: ``regions.stored_window``.)
    scale = render_scale(width_pt, height_pt, size)
    image = page.render(scale=scale, rev_byteorder=True).to_pil()
    image = _center_crop(image, size)
    source = "pdf" if text.strip() else "none"
    if ocr.wants(text):
        scan = page.render(scale=OCR_DPI / 72, rev_byteorder=True).to_pil()
        text, source = ocr_mod.ocr_image(scan), "ocr"
        lines = _plain_lines(text)
    page.close()
    role, heads = describe(lines, index + 1, len(pdf))
    return IngestedPage(index + 1, text, source, encode_jpeg(image, size, quality), *size,
                        role=role, headings=heads)


def _center_crop(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    window = center_window(image.size, size)
    return image if window is None else image.crop(window)  # encode_jpeg resamples the rest


def _image_pages(paths: tuple[Path, ...], numbers: tuple[int, ...] | None, min_pixels: int,
                 max_pixels: int, quality: int, ocr: OcrPolicy, first: int,
                 last: int | None) -> Iterator[IngestedPage]:
    stop = len(paths) if last is None else min(last, len(paths))
    for number in range(first, stop + 1):
        path = paths[number - 1]
        try:
            with Image.open(path) as raw:
                raw.load()
                image = raw.convert("RGB")
        except _IMAGE_ERRORS as exc:
            raise UnreadableDocument(path.parent, f"cannot read image {path.name} ({exc})") from exc
        size = fit_to_budget(*image.size, min_pixels, max_pixels)
        text, source = "", "none"
        if ocr.wants(text):
            text, source = ocr_mod.ocr_image(image), "ocr"
        role, heads = describe(_plain_lines(text), number, len(paths))
        yield IngestedPage(number, text, source, encode_jpeg(image, size, quality), *size,
                           role=role, headings=heads,
                           source_number=None if numbers is None else numbers[number - 1])
