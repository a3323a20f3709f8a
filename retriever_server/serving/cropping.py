"""Draw a crop: a region of a page rendered from its PDF, or cut from its stored page image.

`Cropper.crop` answers one crop as a `Crop` (JPEG bytes, size, and which source it came from)
or raises `RegionTooSmall` (the box covers too little of its source: the asker's mistake).
Sizes follow ``regions.crop_size``. A box is a part of the stored page image (what the model
saw); on a PDF page it is the same part of what that image shows (``regions.stored_window``).
A PDF page renders only the region, at the scale that gives
the crop's size (so text is drawn at that resolution, not upscaled); a page without a PDF in the
index (a page-image document, or an index built before crops kept PDFs) is cut from its stored
image and resized, and says so: ``source`` is `FROM_PAGE_IMAGE`.

pdfium is not thread-safe, and the server computes in a few threads: every pdfium call of this
module holds `PDFIUM_LOCK` (JPEG encoding does not). A `Cropper` opens each document's PDF at
most once and must be closed (`close`, or use it as a context manager): one per request.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass

import pypdfium2 as pdfium
from PIL import Image

from ..backends.base import Backend
from ..storage.imaging import encode_jpeg
from . import regions

PDFIUM_LOCK = threading.Lock()
FROM_PDF = "pdf"
FROM_PAGE_IMAGE = "page_image"


class RegionTooSmall(ValueError):
    """The box covers too few points or pixels of its source; the message says how many."""


@dataclass(frozen=True)
class Crop:
    jpeg: bytes
    width: int
    height: int
    source: str  # FROM_PDF or FROM_PAGE_IMAGE


class Cropper:
    def __init__(self, backend: Backend, jpeg_quality: int):
        self.backend, self.quality = backend, jpeg_quality
        self._pdfs: dict[str, pdfium.PdfDocument | None] = {}

    def crop(self, doc_id: str, page: int, box, band: regions.Band) -> Crop:
        """The crop of ``box`` (checked by ``contract.box_problem``) of a 1-based page that the
        document has. Raises `RegionTooSmall`; KeyError / IndexError / OSError / pdfium errors
        when the page cannot be read."""
        pdf = self._pdf(doc_id)
        stored = self.backend.page_image(doc_id, page)
        if pdf is None:
            return self._from_image(stored.jpeg, box, band)
        return self._from_pdf(pdf, page, (stored.width, stored.height), box, band)

    def close(self) -> None:
        with PDFIUM_LOCK:
            for pdf in self._pdfs.values():
                if pdf is not None:
                    pdf.close()
        self._pdfs.clear()

    def __enter__(self) -> "Cropper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _pdf(self, doc_id: str) -> pdfium.PdfDocument | None:
        if doc_id not in self._pdfs:
            data = self.backend.source_pdf(doc_id)
            with PDFIUM_LOCK:
                self._pdfs[doc_id] = None if data is None else pdfium.PdfDocument(data)
        return self._pdfs[doc_id]

    def _from_pdf(self, pdf: pdfium.PdfDocument, page: int, stored: tuple[int, int], box,
                  band: regions.Band) -> Crop:
        with PDFIUM_LOCK:
            handle = pdf[page - 1]
            try:
                width_pt, height_pt = handle.get_size()  # as displayed (rotation applied)
                part = regions.region(box, regions.stored_window(width_pt, height_pt, stored))
                left, top, right, bottom = part
                if problem := regions.source_problem(right - left, bottom - top,
                                                     "points of the PDF page"):
                    raise RegionTooSmall(problem)
                size = regions.crop_size(right - left, bottom - top, band, regions.MAX_PDF_SCALE)
                # One scale for both axes; the bitmap is within a pixel or two of `size` on each
                # side (the 28-grid), and encode_jpeg resamples that last bit.
                scale = max(size[0] / (right - left), size[1] / (bottom - top))
                bitmap = handle.render(scale=scale, crop=regions.pdf_margins(
                    part, width_pt, height_pt), rev_byteorder=True)
                image = bitmap.to_pil().copy()
                bitmap.close()
            finally:
                handle.close()
        return Crop(encode_jpeg(image, size, self.quality), *size, FROM_PDF)

    def _from_image(self, jpeg: bytes, box, band: regions.Band) -> Crop:
        with Image.open(io.BytesIO(jpeg)) as raw:
            raw.load()
            image = raw.convert("RGB")
        left, top, right, bottom = regions.region(box, (0, 0, *image.size))
        if problem := regions.source_problem(right - left, bottom - top,
                                             "pixels of the stored page image"):
            raise RegionTooSmall(problem)
        size = regions.crop_size(right - left, bottom - top, band, regions.IMAGE_SCALE)
        # Cut and resize in one step, from the exact (fractional) region.
        cut = image.resize(size, Image.Resampling.BICUBIC, box=(left, top, right, bottom))
        return Crop(encode_jpeg(cut, size, self.quality), *size, FROM_PAGE_IMAGE)
