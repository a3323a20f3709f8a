"""Build an index directory: page images, text, BM25, a copy of each PDF, manifest; written
atomically.

Everything goes into a temporary directory beside the target, which is renamed into place only
once complete, so readers never see a half-written index. Re-indexing builds a fresh directory
and swaps it in crash-safely (``storage/swap.py``: the previous one is removed after the swap,
or later while a server still reads it).

Pages are ingested in chunks (a page range of one document); with ``workers > 1`` the chunks
run in worker processes (render + JPEG encode is CPU-bound and pdfium is not thread-safe).
Row numbers are assigned before any work starts, so the result does not depend on scheduling.

A document that cannot be read is left out and recorded in the manifest's ``skipped``
(``unreadable``: found while planning, a PDF that does not open; or while ingesting, a page that
does not render, an image that does not decode), unless ``unreadable="fail"``. When no document
can be read, nothing is written and ``build_index`` raises ValueError.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..storage.imaging import (DEFAULT_DPI, DEFAULT_JPEG_QUALITY, DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS,
                               fit_to_budget)
from ..storage.manifest import (MANIFEST_NAME, DocEntry, Manifest, PageEntry, image_name,
                                missing_numbers, pdf_name, write_manifest)
from ..storage.swap import new_build_dir, recover, swap_in
from . import unreadable as unreadable_mod
from .ingest import DocSource, OcrPolicy, UnreadableDocument, count_pages, discover, iter_pages
from .suggest import fresh_index_dir

CHUNK_PAGES = 16
# Below this many pages, starting worker processes costs more than it saves.
MIN_PAGES_FOR_WORKERS = 64


@dataclass(frozen=True)
class _Chunk:
    doc: DocSource
    first: int
    last: int
    first_row: int
    out: Path
    min_pixels: int
    max_pixels: int
    quality: int
    ocr: str
    dpi: float


def _ingest_chunk(chunk: _Chunk) -> tuple[list[PageEntry], int, str | None]:
    """Write the chunk's JPEGs into the build dir; its manifest entries, OCR-skipped count, and
    why its document cannot be read (None when it can: the entries are then the chunk's pages)."""
    policy = OcrPolicy(chunk.ocr)
    entries = []
    pages = iter_pages(chunk.doc, min_pixels=chunk.min_pixels, max_pixels=chunk.max_pixels,
                       jpeg_quality=chunk.quality, ocr=policy, first=chunk.first, last=chunk.last,
                       dpi=chunk.dpi)
    try:
        for offset, page in enumerate(pages):
            name = image_name(chunk.first_row + offset)
            (chunk.out / name).write_bytes(page.jpeg)
            entries.append(PageEntry(chunk.doc.doc_id, page.page, page.text, page.text_source, name,
                                     page.width, page.height, len(page.jpeg), page.role,
                                     list(page.headings), page.source_number))
    except UnreadableDocument as exc:  # returned, not raised: the parent decides (skip or fail)
        return [], policy.skipped, exc.reason
    if len(entries) != chunk.last - chunk.first + 1:
        raise ValueError(f"{chunk.doc.path}: expected pages {chunk.first}..{chunk.last}, "
                         f"read {len(entries)}")
    return entries, policy.skipped, None


def build_index(sources: list[Path], out_dir: Path, *, min_pixels: int = DEFAULT_MIN_PIXELS,
                max_pixels: int = DEFAULT_MAX_PIXELS, jpeg_quality: int = DEFAULT_JPEG_QUALITY,
                ocr: str = "auto", dpi: float = DEFAULT_DPI, progress: bool = True,
                workers: int | None = None, encoder: str | None = None,
                backend: str | None = None, qdrant_url: str | None = None,
                search: str | None = None, unreadable: str = "skip") -> Path:
    """Index ``sources`` (PDFs, folders of PDFs, folders of page images) into ``out_dir``.

    ``workers``: ingest processes (default: one per CPU for corpora of 64+ pages, else 1).
    ``encoder`` (``NAME:PATH``), ``backend`` (``bm25`` | ``qdrant``; default ``qdrant`` with an
    encoder), ``qdrant_url`` (default: local mode inside the index) and ``search`` (``hybrid`` |
    ``dense``) add dense multi-vector search (``dense_index``). ``unreadable``: ``skip`` a
    document that cannot be read (recorded in the manifest's ``skipped``) or ``fail`` at the first
    (``UnreadableDocument``, a ValueError); either way nothing is written if none can be read.
    """
    from .dense_index import DenseOptions

    dense = DenseOptions.from_args(encoder, backend, qdrant_url, search)
    out_dir = Path(out_dir).absolute()
    if not 18 <= dpi <= 600:
        raise ValueError(f"dpi must be in 18..600, got {dpi}")
    if not 1 <= jpeg_quality <= 95:
        raise ValueError(f"jpeg_quality must be in 1..95, got {jpeg_quality}")
    fit_to_budget(1, 1, min_pixels, max_pixels)  # the pixel band, checked before any work
    unreadable_mod.check_mode(unreadable)
    recover(out_dir)  # finish or undo a swap that a crash interrupted (see storage/swap.py)
    if out_dir.exists() and not (out_dir / MANIFEST_NAME).is_file():
        # Say where it can go: a path that does not exist yet is always accepted.
        raise FileExistsError(f"{out_dir} exists and is not an index; refusing to replace it: pass an --out "
                              f"that does not exist yet, e.g. --out {shlex.quote(str(fresh_index_dir(out_dir)))}")
    docs = discover([Path(s) for s in sources])
    OcrPolicy(ocr)  # validate the mode (and tesseract for "on") before any work
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp, claim = new_build_dir(out_dir)
    try:
        settings = {"min_pixels": min_pixels, "max_pixels": max_pixels,
                    "quality": jpeg_quality, "ocr": ocr, "dpi": dpi}
        manifest, ocr_skipped = _build_into(tmp, docs, settings, progress, workers, dense, unreadable)
        write_manifest(tmp, manifest)
        swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(claim)
    _notice_numbering_gaps(manifest)
    if ocr_skipped:
        print(f"notice: {ocr_skipped} page(s) have no text layer and tesseract is not installed; "
              f"they are indexed without text (install tesseract-ocr to OCR them)", file=sys.stderr)
    return out_dir


SHOWN_GAPS = 10  # missing numbers named per folder in the notice


def _notice_numbering_gaps(manifest: Manifest) -> None:
    """One notice line per image folder whose numbered images skip numbers (SlideVQA's download
    leaves out slides that fail with 404): its pages are still numbered by position, and gold
    pages written as slide numbers must be mapped (``convert-dataset --index`` does)."""
    for doc_id, numbers in manifest.source_numbers().items():
        gaps = missing_numbers(numbers, SHOWN_GAPS + 1)
        if gaps:
            shown = ", ".join(map(str, gaps[:SHOWN_GAPS])) + (", ..." if len(gaps) > SHOWN_GAPS else "")
            print(f"notice: {doc_id!r}: no image numbered {shown}; its {len(numbers)} images are "
                  f"pages 1..{len(numbers)} in order, each image's own number is recorded "
                  f"(convert-dataset --index maps slide numbers through it)", file=sys.stderr)


def _keep_pdf(doc: DocSource, number: int, tmp: Path) -> str | None:
    """Copy a PDF document into the index (crops render from it; a copy, so the index stays
    whole and swaps as one, whatever happens to the source later); its name there."""
    if doc.kind != "pdf":
        return None
    name = pdf_name(number)
    (tmp / name).parent.mkdir(exist_ok=True)
    shutil.copyfile(doc.path, tmp / name)
    return name


def _plan(docs: list[DocSource], tmp: Path, settings: dict,
          unreadable: str) -> tuple[list[_Chunk], list[DocEntry], dict[str, dict]]:
    """Chunks and document entries of the documents that open; {doc_id: skipped entry} of those
    that do not (``unreadable="fail"``: the first raises)."""
    chunks, entries, skipped, row = [], [], {}, 0
    for number, doc in enumerate(docs):
        try:
            n = count_pages(doc)
            if n == 0:
                raise UnreadableDocument(doc.path, "document has no pages")
        except UnreadableDocument as exc:
            if unreadable == "fail":
                raise
            skipped[doc.doc_id] = unreadable_mod.skipped_entry(doc.path, exc.reason)
            continue
        entries.append(DocEntry(doc.doc_id, str(doc.path), n, row, _keep_pdf(doc, number, tmp)))
        for first in range(1, n + 1, CHUNK_PAGES):
            last = min(n, first + CHUNK_PAGES - 1)
            chunks.append(_Chunk(doc, first, last, row + first - 1, tmp, **settings))
        row += n
    return chunks, entries, skipped


def _build_into(tmp: Path, docs, settings: dict, progress: bool,
                workers: int | None, dense=None, unreadable: str = "skip") -> tuple[Manifest, int]:
    (tmp / "pages").mkdir()
    chunks, doc_entries, skipped = _plan(docs, tmp, settings, unreadable)
    if doc_entries:  # else nothing to ingest: said below, before any progress bar
        pages, ocr_skipped, failed = _ingest(chunks, progress, workers, unreadable)
        if failed:  # read late: their rows were assigned, so the documents after them move down
            pages, doc_entries = unreadable_mod.drop(pages, doc_entries, tmp, set(failed))
            skipped.update(failed)
    skipped_list = [skipped[d.doc_id] for d in docs if d.doc_id in skipped]  # discovery order
    if not doc_entries:
        raise unreadable_mod.nothing_indexed(skipped_list)
    # Imported here: bm25s pulls in numba, which ingest worker processes do not need.
    from ..backends import bm25

    pages = _without_running_headings(pages, doc_entries)
    backend = bm25.build(pages, tmp)
    if dense is not None:
        from .dense_index import add_dense

        backend = add_dense(tmp, pages, backend, dense, progress)
    recorded = {k: v for k, v in settings.items() if k != "quality"}
    manifest = Manifest(docs=doc_entries, pages=pages, backend=backend,
                        settings={**recorded, "jpeg_quality": settings["quality"]}, skipped=skipped_list)
    manifest.check()
    return manifest, ocr_skipped


def _ingest(chunks: list[_Chunk], progress: bool, workers: int | None,
            unreadable: str) -> tuple[list[PageEntry], int, dict[str, dict]]:
    """Every chunk's pages in row order, the count of pages left without OCR, and {doc_id: skipped
    entry} of the documents found unreadable (``unreadable="fail"``: the first raises)."""
    total = sum(c.last - c.first + 1 for c in chunks)
    if workers is None:
        workers = (os.cpu_count() or 1) if total >= MIN_PAGES_FOR_WORKERS else 1
    pages: list[PageEntry] = []
    ocr_skipped, failed = 0, {}
    with tqdm(total=total, unit="page", desc="indexing", disable=not progress) as bar:
        if workers <= 1:
            results = map(_ingest_chunk, chunks)
            pool = None
        else:
            # spawn: pdfium state must not be inherited through fork.
            pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            results = pool.map(_ingest_chunk, chunks)
        try:
            # in chunk order, so rows stay in order
            for chunk, (entries, chunk_skipped, failure) in zip(chunks, results, strict=True):
                if failure is not None:
                    if unreadable == "fail":
                        raise UnreadableDocument(chunk.doc.path, failure)
                    failed.setdefault(chunk.doc.doc_id, unreadable_mod.skipped_entry(chunk.doc.path, failure))
                pages.extend(entries)
                ocr_skipped += chunk_skipped
                bar.update(chunk.last - chunk.first + 1)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    return pages, ocr_skipped, failed


def _without_running_headings(pages: list[PageEntry], docs: list[DocEntry]) -> list[PageEntry]:
    """Headings that recur across a document's pages are running headers: drop them."""
    from dataclasses import replace

    from .headings import drop_running_lines

    out = list(pages)
    for doc in docs:
        rows = range(doc.first_row, doc.first_row + doc.num_pages)
        kept = drop_running_lines([tuple(pages[r].headings) for r in rows])
        for r, heads in zip(rows, kept, strict=True):
            if list(heads) != pages[r].headings:
                out[r] = replace(pages[r], headings=list(heads))
    return out

