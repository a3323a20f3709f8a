"""Read side of an index directory: pages looked up by (doc_id, page) in the manifest.

Ids from requests are only ever dictionary keys here; file names come from the manifest, so no
request can name a path.

A store reads one directory for its whole life: the one its descriptor (taken with a shared
lock, see ``swap.open_shared``) refers to, whatever the index path names later. The manifest
and every page are read through that descriptor; a backend that loads more files by path
checks ``is_at`` afterwards (``backends.base.open_whole``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .manifest import DocEntry, Manifest, PageEntry, read_manifest
from .swap import names, open_shared


class IndexReplacedError(OSError):
    """The index directory was rebuilt and swapped after this store opened it."""


@dataclass(frozen=True)
class PageImage:
    jpeg: bytes
    width: int
    height: int
    mime: str = "image/jpeg"


class PageStore:
    def __init__(self, root: Path, manifest: Manifest, dir_fd: int | None = None):
        """``dir_fd``: a locked descriptor of ``root`` (``swap.open_shared``) whose manifest
        ``manifest`` is; the store owns it. Default: open ``root`` now."""
        self.root = Path(root).resolve()
        self.manifest = manifest
        # Re-indexing swaps a new directory in under the same name. Pages are read through a
        # descriptor of the directory opened here, so this store keeps serving the index it
        # opened; its shared lock keeps a swap from deleting that directory (see swap.py).
        self._dir_fd = open_shared(self.root) if dir_fd is None else dir_fd
        self._closer = weakref.finalize(self, os.close, self._dir_fd)
        self._docs: dict[str, DocEntry] = {d.doc_id: d for d in manifest.docs}
        self._page_counts = {d.doc_id: d.num_pages for d in manifest.docs}

    @classmethod
    def open(cls, index_dir) -> "PageStore":
        """The index ``index_dir`` names now: its directory locked first, then its manifest read
        through the descriptor, so both are of the same directory even during a swap."""
        fd = open_shared(Path(index_dir))
        try:
            manifest = read_manifest(Path(index_dir), dir_fd=fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(Path(index_dir), manifest, dir_fd=fd)

    @property
    def inode(self) -> int:
        """Inode of the directory this store reads (the same one even after a swap renamed it)."""
        return os.fstat(self._dir_fd).st_ino

    def is_at(self, path) -> bool:
        """True when ``path`` still names the directory this store reads."""
        return names(Path(path), self._dir_fd)

    def close(self) -> None:
        """Let go of the directory now (else when the store is collected): a swap may delete it."""
        self._closer()

    def documents(self) -> Mapping[str, int]:
        """doc_id -> number of pages, in index order."""
        return self._page_counts

    def doc_rows(self, doc_id: str) -> tuple[int, int]:
        """[start, stop) rows of ``doc_id`` in corpus order; KeyError when unknown."""
        doc = self._docs[doc_id]
        return doc.first_row, doc.first_row + doc.num_pages

    def entry(self, doc_id: str, page: int) -> PageEntry:
        """Manifest entry of a 1-based page; KeyError / IndexError when absent."""
        doc = self._docs[doc_id]
        if not 1 <= page <= doc.num_pages:
            raise IndexError(f"page {page} out of range 1..{doc.num_pages}")
        return self.manifest.pages[doc.first_row + page - 1]

    def entry_at(self, row: int) -> PageEntry:
        return self.manifest.pages[row]

    def page_text(self, doc_id: str, page: int) -> str:
        return self.entry(doc_id, page).text

    def image_sizes(self, doc_id: str) -> list[int]:
        """Bytes of each page's JPEG, page 1 first (as ``page_image`` will read them)."""
        start, stop = self.doc_rows(doc_id)
        return [entry.bytes for entry in self.manifest.pages[start:stop]]

    def _read(self, name: str) -> bytes:
        try:
            fd = os.open(name, os.O_RDONLY, dir_fd=self._dir_fd)
            with open(fd, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def _replaced(self) -> IndexReplacedError:
        return IndexReplacedError(f"the index at {self.root.name} was rebuilt since the server "
                                  f"started and its old files are gone; restart the retriever")

    def page_image(self, doc_id: str, page: int) -> PageImage:
        entry = self.entry(doc_id, page)
        data = self._read(entry.image)
        if len(data) != entry.bytes:  # the directory was deleted or altered under us
            raise self._replaced()
        return PageImage(data, entry.width, entry.height)

    def source_pdf(self, doc_id: str) -> bytes | None:
        """The bytes of the copy of ``doc_id``'s PDF kept in the index; None when the index
        keeps none (a page-image document, or an index built before crops). KeyError when
        unknown."""
        name = self._docs[doc_id].pdf
        if name is None:
            return None
        data = self._read(name)
        if not data:
            raise self._replaced()
        return data
