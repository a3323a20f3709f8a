"""Search backends behind one interface (see ``base.Backend``); BM25 is the embedded default.

``open_backend`` picks what an index was built for (its manifest's ``backend``): page-aware BM25
(``bm25``), or Qdrant multi-vector search (``qdrant``), alone (``search: dense``) or fused with
BM25 (``search: hybrid``, the default). Backends read an index through ``storage.store``; they
know nothing of serving or HTTP.

- `base`: the interface (`Backend`, `Hit`) and `StoreBackend`, pages served from a `PageStore`.
- `bm25`: the embedded default: page-aware BM25 over page text and heading lines, in any scope
  (one document, a subset, the corpus).
- `qdrant`: dense multi-vector search in Qdrant (one point per page, MaxSim), and its build.
- `fusion`: hybrid search: reciprocal-rank fusion of a lexical and a dense backend.
- `late_interaction`: a fixed-dimensional first stage with exact MaxSim re-ranking, the candidate
  engine `scripts/bench_dense_corpus.py` measures against Qdrant (not served: docs/dense-corpus.md).
"""

from __future__ import annotations

import os

from .base import Backend, Hit, open_whole

__all__ = ["Backend", "Hit", "open_backend"]


def open_backend(index_dir, encoder: str | None = None) -> Backend:
    """The backend an index directory was built for, loaded whole from one directory even while
    a re-index swaps it (``base.open_whole``).

    ``encoder`` (default: ``$VRAG_RETRIEVER_ENCODER``, else the manifest's) is checked against the
    encoder the index was built with (``encoders.resolve_encoder``); a mismatch raises
    ``EncoderMismatch`` (a ValueError).
    """
    from ..encoders import ENV_ENCODER

    requested = encoder or os.environ.get(ENV_ENCODER) or None
    encoders: dict = {}  # spec -> loaded encoder, kept if a swap makes the load start over
    return open_whole(index_dir, lambda store: _backend_for(store, requested, encoders))


def _backend_for(store, encoder: str | None, encoders: dict) -> Backend:
    from ..encoders import resolve_encoder

    info = store.manifest.backend
    spec = resolve_encoder(info, encoder)
    kind = info.get("kind")
    if kind == "bm25":
        from .bm25 import Bm25Backend

        return Bm25Backend.from_store(store)
    if kind == "qdrant":
        from ..encoders import load_encoder
        from .bm25 import Bm25Backend
        from .fusion import HybridBackend
        from .qdrant import QdrantBackend

        if spec not in encoders:
            encoders[spec] = load_encoder(spec)
        dense = QdrantBackend.from_store(store, encoders[spec])
        if info.get("search", "hybrid") == "dense":
            return dense
        try:
            lexical = Bm25Backend.from_store(store)
        except BaseException:
            dense.close()
            raise
        return HybridBackend(lexical, dense, k=int(info.get("rrf_k", 60)))
    raise ValueError(f"index uses backend {kind!r}, which this build does not provide")
