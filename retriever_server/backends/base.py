"""The backend interface the HTTP app talks to.

A backend answers two questions: which pages best match a query, inside one document, a subset
of documents or the whole corpus (``search``, see `Scope`), and what a page looks like
(``page_image`` / ``page_text``). The app validates requests (known doc ids, non-empty subsets,
page ranges, query length) before calling in, and turns pages into wire JSON itself, so a
backend never sees raw request data or formats responses.

A stronger engine is a drop-in: implement this class and hand the instance to
``retriever_server.api.app.create_app``. ``qdrant.QdrantBackend`` is one (multi-vector pages in
Qdrant, filtered by document), ``fusion.HybridBackend`` combines two. Nothing in the app, the
wire format or the client changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional, TypeVar, Union

from ..storage.store import IndexReplacedError, PageImage, PageStore

# A load that a swap overtakes this many times in a row is not going to settle; say so.
LOAD_ATTEMPTS = 3
B = TypeVar("B", bound="Backend")
# Where one query searches: a doc id (that document), None (the whole corpus), or a non-empty
# frozenset/tuple of doc ids (only those documents).
Scope = Optional[Union[str, frozenset, tuple]]


def doc_order_key(documents: Mapping[str, int]) -> Callable[["Hit"], tuple]:
    """Sort key of hits: best score first, ties by (document's place in the index, page)."""
    order = {doc_id: i for i, doc_id in enumerate(documents)}
    return lambda hit: (-hit.score, order.get(hit.doc_id, len(order)), hit.page)


@dataclass(frozen=True)
class Hit:
    doc_id: str
    page: int  # 1-based
    score: float


class Backend(ABC):
    name: str = "abstract"

    @abstractmethod
    def documents(self) -> Mapping[str, int]:
        """doc_id -> number of pages."""

    @abstractmethod
    def search(self, queries: list[str], doc_ids: list[Scope], top_n: int) -> list[list[Hit]]:
        """For each i, the best ``top_n`` pages in scope ``doc_ids[i]`` for ``queries[i]``, best
        first.

        ``doc_ids[i]`` is a doc id (only that document's pages), None (every page of the index)
        or a non-empty frozenset/tuple of doc ids (only their pages). Callers pass known doc ids
        and non-empty queries; ties are broken by (document's place in the index, page), i.e.
        by corpus row, so answers are deterministic.
        """

    @abstractmethod
    def page_image(self, doc_id: str, page: int) -> PageImage:
        """Pre-encoded image of a 1-based page; KeyError/IndexError when absent."""

    @abstractmethod
    def page_text(self, doc_id: str, page: int) -> str:
        """Text of a 1-based page (PDF text layer or OCR); KeyError/IndexError when absent."""

    def page_info(self, doc_id: str, page: int) -> Mapping[str, object]:
        """Optional extra fields of a page for answers (``role``, ``headings``); none by default."""
        return {}

    def source_pdf(self, doc_id: str) -> bytes | None:
        """Optional: the document's PDF, which crops render from (``cropping``); None (the
        default): crops are cut from the page images."""
        return None

    def image_sizes(self, doc_id: str) -> Sequence[int] | None:
        """Optional: the bytes of each page's image (page 1 first), which bound an answer's size
        before searching (``answer_size``); None (the default): answers are measured instead."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately not abstract
        """Release resources (a client connection, mmaps). Optional."""


class StoreBackend(Backend, ABC):
    """A backend whose pages live in the index's ``PageStore`` (``self.store``): only the
    ranking is its own."""

    store: "PageStore"

    def page_info(self, doc_id: str, page: int) -> dict:
        entry = self.store.entry(doc_id, page)
        return {"role": entry.role, "headings": list(entry.headings)}

    def image_sizes(self, doc_id: str) -> Sequence[int] | None:
        return self.store.image_sizes(doc_id)

    def page_image(self, doc_id: str, page: int) -> PageImage:
        return self.store.page_image(doc_id, page)

    def source_pdf(self, doc_id: str) -> bytes | None:
        return self.store.source_pdf(doc_id)

    def page_text(self, doc_id: str, page: int) -> str:
        return self.store.page_text(doc_id, page)


def open_whole(index_dir, make: Callable[[PageStore], B]) -> B:
    """``make(store)`` over the index ``index_dir`` names, all of it from one directory.

    ``make`` may load files by path (``store.root / ...``: bm25s and Qdrant take paths), and a
    re-index may swap another directory in under that path meanwhile. So the path is checked to
    still name the store's directory once ``make`` is done (it never names that directory again
    once swapped out); if not, the mixed result is closed and the load starts over.
    """
    for _ in range(LOAD_ATTEMPTS):
        store = PageStore.open(index_dir)
        try:
            backend = make(store)
        except Exception:
            if store.is_at(index_dir):
                raise  # a real failure, not a swap overtaking the load
            store.close()
            continue
        if store.is_at(index_dir):
            return backend
        backend.close()
        store.close()
    raise IndexReplacedError(f"{index_dir} was re-indexed {LOAD_ATTEMPTS} times while being "
                             f"loaded; load it again")
