"""The index manifest: what an index directory holds, in one JSON file.

Rows of ``pages`` are in corpus order (the order of the BM25 matrix); a document's pages are
contiguous and sorted by page number, which is what lets search slice one document cheaply.

A PDF document's entry names the copy of its PDF kept inside the index (``pdf``:
``sources/<n>.pdf``), which crops render from. The field is optional: indexes built before
crops (and page-image documents) have none, and crop from the stored page images instead.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
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
    # Optional (absent in indexes built before page roles): see retriever_server.roles / headings.
    role: str = "body"
    headings: list[str] = field(default_factory=list)


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=1)

    @classmethod
    def from_json(cls, raw: str) -> "Manifest":
        data = json.loads(raw)
        if data.get("format") != FORMAT:
            raise ValueError("not a vrag-retriever index (manifest format mismatch)")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"index format version {data.get('format_version')} is not supported "
                             f"(this build reads version {FORMAT_VERSION}); re-run `vrag-retriever index`")
        manifest = cls(docs=[DocEntry(**d) for d in data["docs"]],
                       pages=[PageEntry(**p) for p in data["pages"]],
                       settings=data["settings"], backend=data["backend"])
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
        if sum(d.num_pages for d in self.docs) != len(self.pages):
            raise ValueError("manifest: page count mismatch")
        for doc in self.docs:
            if doc.pdf is not None and not (isinstance(doc.pdf, str) and PDF_NAME_RE.match(doc.pdf)):
                raise ValueError(f"manifest: refusing PDF name {doc.pdf!r}")
        for entry in self.pages:
            if not IMAGE_NAME_RE.match(entry.image):
                raise ValueError(f"manifest: refusing image name {entry.image!r}")


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
    with open(fd, encoding="utf-8") as f:
        return Manifest.from_json(f.read())


def write_manifest(index_dir: Path, manifest: Manifest) -> None:
    (Path(index_dir) / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
