"""Search backends behind one interface (see ``base.Backend``); BM25 is the embedded default."""

from .base import Backend, Hit

__all__ = ["Backend", "Hit", "open_backend"]


def open_backend(index_dir) -> Backend:
    """The backend an index directory was built for (its manifest names it)."""
    from ..store import PageStore

    store = PageStore.open(index_dir)
    kind = store.manifest.backend.get("kind")
    if kind == "bm25":
        from .bm25 import Bm25Backend

        return Bm25Backend.from_store(store)
    raise ValueError(f"index uses backend {kind!r}, which this build does not provide")
