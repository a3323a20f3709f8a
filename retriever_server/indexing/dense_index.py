"""Index-time choices for dense retrieval, and the manifest's record of them.

``DenseOptions.from_args`` validates the ``index`` options (encoder, backend, Qdrant URL, search
mode) before any work starts; ``add_dense`` encodes the pages of a freshly built index into
Qdrant and returns the manifest's ``backend`` entry, which keeps the BM25 keys (the lexical half
of hybrid search) and adds::

    {"kind": "qdrant", "search": "hybrid" | "dense", "rrf_k": 60,
     "encoder": {"spec": "colqwen2:/abs/path", "fingerprint": "colqwen2:<hash>", "dim": 128},
     "qdrant": {"path": "qdrant", "collection": "pages"} | {"url": URL, "collection": NAME}}

``encoders.resolve_encoder`` is the guard used when an index is opened: an index built for one
encoder is never searched with another (different vectors would give meaningless scores silently).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backends.fusion import RRF_K
from ..encoders import parse_spec

BACKENDS = ("bm25", "qdrant")
SEARCH_MODES = ("hybrid", "dense")


@dataclass(frozen=True)
class DenseOptions:
    encoder: str
    qdrant_url: str | None
    search: str

    @classmethod
    def from_args(cls, encoder: str | None, backend: str | None, qdrant_url: str | None,
                  search: str | None) -> "DenseOptions | None":
        """None for a lexical (BM25) index; ValueError for contradictory options."""
        backend = backend or ("qdrant" if encoder else "bm25")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if backend == "bm25":
            if encoder:
                raise ValueError("--encoder needs --backend qdrant (BM25 stores no vectors)")
            if qdrant_url or search:
                raise ValueError("--qdrant-url and --search need --backend qdrant")
            return None
        if not encoder:
            raise ValueError("--backend qdrant needs --encoder NAME:PATH (e.g. colqwen2:/models/x)")
        parse_spec(encoder)  # a clear error now, not after ingesting every page
        search = search or "hybrid"
        if search not in SEARCH_MODES:
            raise ValueError(f"search must be one of {', '.join(SEARCH_MODES)}, got {search!r}")
        return cls(encoder, qdrant_url, search)


def add_dense(index_dir: Path, pages, backend_info: dict, options: DenseOptions,
              progress: bool = True) -> dict:
    """Encode every page of the index being built at ``index_dir`` into Qdrant."""
    from tqdm import tqdm

    from ..backends import qdrant
    from ..encoders import load_encoder

    encoder = load_encoder(options.encoder)
    with tqdm(total=len(pages), unit="page", desc="encoding", disable=not progress) as bar:
        location = qdrant.build(index_dir, pages, lambda r: (index_dir / pages[r].image).read_bytes(),
                                encoder, qdrant_url=options.qdrant_url, progress=bar.update)
    return {**backend_info, "kind": "qdrant", "search": options.search, "rrf_k": RRF_K,
            "encoder": {"spec": encoder.spec, "fingerprint": encoder.fingerprint,
                        "dim": encoder.dim},
            "qdrant": location}
