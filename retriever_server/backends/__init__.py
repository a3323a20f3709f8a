"""Search backends behind one interface (see ``base.Backend``); BM25 is the embedded default.

``open_backend`` picks what an index was built for (its manifest's ``backend``): page-aware BM25
(``bm25``), or Qdrant multi-vector search (``qdrant``), alone (``search: dense``) or fused with
BM25 (``search: hybrid``, the default).
"""

from __future__ import annotations

import os

from .base import Backend, Hit

__all__ = ["Backend", "Hit", "open_backend"]


def open_backend(index_dir, encoder: str | None = None) -> Backend:
    """The backend an index directory was built for.

    ``encoder`` (default: ``$VRAG_RETRIEVER_ENCODER``, else the manifest's) is checked against the
    encoder the index was built with (``dense_index.resolve_encoder``); a mismatch raises
    ``EncoderMismatch`` (a ValueError).
    """
    from ..dense_index import ENV_ENCODER, resolve_encoder
    from ..store import PageStore

    store = PageStore.open(index_dir)
    info = store.manifest.backend
    spec = resolve_encoder(info, encoder or os.environ.get(ENV_ENCODER) or None)
    kind = info.get("kind")
    if kind == "bm25":
        from .bm25 import Bm25Backend

        return Bm25Backend.from_store(store)
    if kind == "qdrant":
        from ..encoders import load_encoder
        from .bm25 import Bm25Backend
        from .fusion import HybridBackend
        from .qdrant import QdrantBackend

        dense = QdrantBackend.from_store(store, load_encoder(spec))
        if info.get("search", "hybrid") == "dense":
            return dense
        return HybridBackend(Bm25Backend.from_store(store), dense, k=int(info.get("rrf_k", 60)))
    raise ValueError(f"index uses backend {kind!r}, which this build does not provide")
