"""The index manifest: what an index directory holds, in one JSON file.

Rows of ``pages`` are in corpus order (the order of the BM25 matrix); a document's pages are
contiguous and sorted by page number, which is what lets search slice one document cheaply.

A PDF document's entry names the copy of its PDF kept inside the index (``pdf``:
``sources/<n>.pdf``), which crops render from. The field is optional: indexes built before
crops (and page-image documents) have none, and crop from the stored page images instead.

A page's ``page`` is its position in the document (1..n, what the wire's page ids say). A page of
an image folder whose file names number the images also records that number, ``source_number``
(``ingest.image_numbers``; written only when set, so other manifests are unchanged): a folder
missing slide 3 serves slides 1, 2, 4, ... as pages 1, 2, 3, ..., with source numbers 1, 2, 4.

``skipped`` lists the documents the build found but could not read (``indexing/unreadable.py``),
each ``{"source": path, "reason": why}``; written only when there are some (an index without is
written as before), read as ``[]`` when absent.

``read_manifest`` names the index directory in every error, and a manifest that is not JSON, or
lacks a field, is a ValueError saying so (never a KeyError or a bare JSON decoder message).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path

FORMAT = "vrag-retriever-index"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# Image names are written by the indexer only; the store refuses anything else (defence in depth
# against a hand-edited manifest pointing outside the index).
IMAGE_NAME_RE = re.compile(r"^pages/[0-9]{6,}\.jpg$")
PDF_NAME_RE = re.compile(r"^sources/[0-9]{6,}\.pdf$")


def image_name(row: int) -> str:
    return f"pages/{row:06d}.jpg"


def pdf_name(doc_number: int) -> str:
    """Name of the ``doc_number``-th document's PDF copy inside the index (0-based)."""
    return f"sources/{doc_number:06d}.pdf"


@dataclass(frozen=True)
class PageEntry:
    doc_id: str
    page: int  # 1-based
    text: str
    text_source: str
    image: str  # relative file name inside the index dir
    width: int
    height: int
    bytes: int
    # Optional (absent in indexes built before page roles): see indexing/roles.py, headings.py.
    role: str = "body"
    headings: list[str] = field(default_factory=list)
    # Optional (absent for PDF pages, unnumbered folders and older indexes): the number in the
    # page image's file name, e.g. its slide number (``ingest.image_numbers``).
    source_number: int | None = None


@dataclass(frozen=True)
class DocEntry:
    doc_id: str
    source: str
    num_pages: int
    first_row: int
    # Optional (absent in indexes built before crops, None for page-image documents): the
    # name of the document's PDF copy inside the index dir, which crops render from.
    pdf: str | None = None


@dataclass(frozen=True)
class Manifest:
    docs: list[DocEntry]
    pages: list[PageEntry]
    settings: dict
    backend: dict
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    # Documents found but not indexed because they could not be read: {"source", "reason"}.
    skipped: list[dict] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        for page in data["pages"]:
            if page["source_number"] is None:  # keeps manifests without numbers as they were
                del page["source_number"]
        if not data["skipped"]:  # likewise for indexes that skipped nothing
            del data["skipped"]
        return json.dumps(data, ensure_ascii=False, indent=1)

    def source_numbers(self) -> dict[str, list[int]]:
        """{doc_id: the own number of each of its pages, page 1 first} of the documents whose
        images are numbered (``PageEntry.source_number``); other documents are left out."""
        out = {}
        for doc in self.docs:
            rows = self.pages[doc.first_row:doc.first_row + doc.num_pages]
            if rows and rows[0].source_number is not None:
                out[doc.doc_id] = [entry.source_number for entry in rows]
        return out

    @classmethod
    def from_json(cls, raw: str) -> "Manifest":
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{MANIFEST_NAME} is not valid JSON ({exc}); re-run `vrag-retriever index`") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a vrag-retriever index (manifest format mismatch)")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"index format version {data.get('format_version')} is not supported "
                             f"(this build reads version {FORMAT_VERSION}); re-run `vrag-retriever index`")
        try:
            manifest = cls(docs=[DocEntry(**d) for d in data["docs"]],
                           pages=[PageEntry(**p) for p in data["pages"]],
                           settings=data["settings"], backend=data["backend"],
                           skipped=list(data.get("skipped", [])))
        except (KeyError, TypeError) as exc:  # a field missing, unknown or of the wrong shape
            raise ValueError(f"{MANIFEST_NAME} lacks or garbles a field ({type(exc).__name__}: {exc}); "
                             f"re-run `vrag-retriever index`") from exc
        manifest.check()
        return manifest

    def check(self) -> None:
        """Raise ValueError unless docs and pages agree (contiguous, 1-based, safe image names)."""
        for doc in self.docs:
            rows = self.pages[doc.first_row:doc.first_row + doc.num_pages]
            if len(rows) != doc.num_pages or doc.num_pages < 1:
                raise ValueError(f"manifest: bad page range for {doc.doc_id!r}")
            for number, entry in enumerate(rows, start=1):
                if entry.doc_id != doc.doc_id or entry.page != number:
                    raise ValueError(f"manifest: pages of {doc.doc_id!r} are not 1..{doc.num_pages}")
            _check_source_numbers(doc.doc_id, [entry.source_number for entry in rows])
        if sum(d.num_pages for d in self.docs) != len(self.pages):
            raise ValueError("manifest: page count mismatch")
        for doc in self.docs:
            if doc.pdf is not None and not (isinstance(doc.pdf, str) and PDF_NAME_RE.match(doc.pdf)):
                raise ValueError(f"manifest: refusing PDF name {doc.pdf!r}")
        for entry in self.pages:
            if not IMAGE_NAME_RE.match(entry.image):
                raise ValueError(f"manifest: refusing image name {entry.image!r}")
        if not all(isinstance(s, dict) and isinstance(s.get("source"), str) and isinstance(s.get("reason"), str)
                   for s in self.skipped):
            raise ValueError("manifest: each skipped entry must be {\"source\": str, \"reason\": str}")


def _check_source_numbers(doc_id: str, numbers: list) -> None:
    """A document's source numbers are all absent, or all integers >= 0 in increasing order."""
    if all(n is None for n in numbers):
        return
    if not all(type(n) is int and n >= 0 for n in numbers) or any(
            a >= b for a, b in zip(numbers, numbers[1:])):
        raise ValueError(f"manifest: source numbers of {doc_id!r} are not increasing integers")


def missing_numbers(numbers: Sequence[int], limit: int | None = None) -> list[int]:
    """The numbers a numbered folder's images skip (at most ``limit`` of them, smallest first):
    those absent between 1 and its largest number when the folder counts pages from 1 (its
    smallest number is at most its image count, so slides lost at the start count too), else
    those absent between its smallest and largest. Slides lost after the last image cannot be
    told from the folder alone."""
    present = set(numbers)
    low = 1 if min(numbers) <= len(numbers) else min(numbers)
    absent: Iterator[int] = (k for k in range(low, max(numbers) + 1) if k not in present)
    return list(absent if limit is None else islice(absent, limit))


def read_manifest(index_dir: Path, dir_fd: int | None = None) -> Manifest:
    """The manifest of ``index_dir``, or with ``dir_fd`` of the directory open as ``dir_fd``
    (whatever ``index_dir`` names by now; ``index_dir`` is then only used in messages)."""
    name = MANIFEST_NAME if dir_fd is not None else Path(index_dir) / MANIFEST_NAME
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        fd = None
    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        fd = None
    if fd is None:
        raise FileNotFoundError(f"{index_dir}: no {MANIFEST_NAME}; not an index directory")
    try:
        with open(fd, encoding="utf-8") as f:
            return Manifest.from_json(f.read())
    except ValueError as exc:  # UnicodeDecodeError included
        raise ValueError(f"{index_dir}: {exc}") from exc


def write_manifest(index_dir: Path, manifest: Manifest) -> None:
    (Path(index_dir) / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
