"""Dense multi-vector backend: one Qdrant point per page, MaxSim scoring, filtered by scope.

Index time (``build``): every page image is encoded (``encoders``) into a multi-vector and
upserted as point ``id = row`` with payload ``{"doc_id", "page"}`` into a collection configured
for ``MAX_SIM`` over dot products (the encoder's rows are L2-normalised, so this is ColBERT-style
late interaction). Where the collection lives:

- local mode (default): ``QdrantClient(path=<index>/qdrant)``, in-process and on disk inside the
  index directory, so it moves and swaps with the index. One process at a time may open it
  (Qdrant locks the folder): serve such an index with one worker.
- server mode (``qdrant_url``): a fresh collection named ``<prefix>-<build id>`` on that server;
  the manifest records URL and collection. ``QDRANT_API_KEY`` (environment) is used when set and
  never written to the manifest. Re-indexing makes a new collection; the previous one stays on
  the server until deleted (a server still reading the old index may need it).

Query time: the queries are encoded in one batch and sent as one ``query_batch_points`` call,
each request limited to ``top_n`` and filtered by its scope: ``MatchValue`` on ``doc_id`` for one
document, ``MatchAny`` for a subset, no filter for the whole corpus. Hits are ordered by score,
ties by (document's place in the index, page). Images, text and page roles
come from the same ``PageStore`` as the BM25 backend.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

from ..encoders import PageEncoder
from ..storage.store import PageStore
from .base import Hit, Scope, StoreBackend, doc_order_key

LOCAL_SUBDIR = "qdrant"
DOC_FIELD, PAGE_FIELD = "doc_id", "page"
UPSERT_BATCH = 32


class FolderInUseError(OSError):
    """A local-mode Qdrant folder is open in another client (Qdrant allows one per folder)."""


def connect(location: Mapping, index_dir: Path):
    """A ``QdrantClient`` for a manifest's ``qdrant`` entry (``{"path": ...}`` or ``{"url": ...}``)."""
    from qdrant_client import QdrantClient

    if location.get("url"):
        return QdrantClient(url=location["url"], api_key=os.environ.get("QDRANT_API_KEY"))
    sub = location.get("path", LOCAL_SUBDIR)
    if sub != LOCAL_SUBDIR:
        raise ValueError(f"unexpected qdrant directory {sub!r} in manifest")
    try:
        return QdrantClient(path=str(Path(index_dir) / LOCAL_SUBDIR))
    except RuntimeError as exc:  # Qdrant's lock on the folder (it never waits for it)
        raise FolderInUseError(
            f"the vectors of {Path(index_dir).name} (Qdrant local mode) are open in another "
            f"client: this process serves that very directory already (reloading it changes "
            f"nothing; re-index first), or another process does (serve it from one process "
            f"only)") from exc


def _create_collection(client, name: str, dim: int, server: bool) -> None:
    from qdrant_client import models

    client.create_collection(
        name, vectors_config=models.VectorParams(
            size=dim, distance=models.Distance.DOT,
            multivector_config=models.MultiVectorConfig(
                comparator=models.MultiVectorComparator.MAX_SIM)))
    if server:  # a keyword index makes the per-document filter cheap (local mode has none)
        client.create_payload_index(name, DOC_FIELD, models.PayloadSchemaType.KEYWORD)


def build(index_dir: Path, pages, jpeg_of, encoder: PageEncoder, *, qdrant_url: str | None = None,
          collection_prefix: str = "vrag-pages", progress=None) -> dict:
    """Encode and upsert every page (``pages``: manifest entries in row order).

    ``jpeg_of(row)`` gives a page's stored JPEG. Returns the manifest's ``qdrant`` entry.
    """
    from qdrant_client import models

    if qdrant_url:
        location = {"url": qdrant_url, "collection": f"{collection_prefix}-{uuid.uuid4().hex[:12]}"}
    else:
        location = {"path": LOCAL_SUBDIR, "collection": "pages"}
    client = connect(location, index_dir)
    try:
        _create_collection(client, location["collection"], encoder.dim, server=bool(qdrant_url))
        for start in range(0, len(pages), UPSERT_BATCH):
            rows = range(start, min(start + UPSERT_BATCH, len(pages)))
            vectors = encoder.encode_images([jpeg_of(r) for r in rows])
            points = [models.PointStruct(id=r, vector=v.tolist(), payload={
                          DOC_FIELD: pages[r].doc_id, PAGE_FIELD: pages[r].page})
                      for r, v in zip(rows, vectors, strict=True)]
            client.upsert(location["collection"], points, wait=True)
            if progress is not None:
                progress(len(points))
    except BaseException:
        if qdrant_url:  # local mode goes away with the build directory; a server keeps it
            client.delete_collection(location["collection"])
        raise
    finally:
        client.close()
    return location


class QdrantBackend(StoreBackend):
    name = "qdrant"

    def __init__(self, store: PageStore, client, collection: str, encoder: PageEncoder):
        self.store, self.client, self.collection, self.encoder = store, client, collection, encoder
        # Qdrant's local mode is not made for concurrent callers; the server calls in from threads.
        self._lock = threading.Lock()

    @classmethod
    def from_store(cls, store: PageStore, encoder: PageEncoder) -> "QdrantBackend":
        location = store.manifest.backend.get("qdrant") or {}
        client = connect(location, store.root)
        if not client.collection_exists(location.get("collection", "")):
            client.close()
            raise ValueError(f"qdrant collection {location.get('collection')!r} not found "
                             f"({location.get('url') or 'local mode'}); re-run `vrag-retriever index`")
        return cls(store, client, location["collection"], encoder)

    def documents(self) -> Mapping[str, int]:
        return self.store.documents()

    @staticmethod
    def _scope_filter(scope: Scope):
        """Qdrant filter of a search scope: one document, a subset (MatchAny), or none."""
        from qdrant_client import models

        if scope is None:
            return None
        if isinstance(scope, str):
            match = models.MatchValue(value=scope)
        else:
            match = models.MatchAny(any=sorted(scope))
        return models.Filter(must=[models.FieldCondition(key=DOC_FIELD, match=match)])

    def search(self, queries: list[str], doc_ids: list[Scope], top_n: int) -> list[list[Hit]]:
        from qdrant_client import models

        if len(queries) != len(doc_ids):
            raise ValueError("queries and doc_ids differ in length")
        if not queries:
            return []
        vectors = self.encoder.encode_queries(queries)
        requests = [models.QueryRequest(query=v, limit=top_n, with_payload=True,
                                        filter=self._scope_filter(doc_id))
                    for v, doc_id in zip(vectors, doc_ids, strict=True)]
        with self._lock:
            answers = self.client.query_batch_points(self.collection, requests)
        key = doc_order_key(self.documents())
        results = []
        for answer in answers:
            hits = [Hit(p.payload[DOC_FIELD], int(p.payload[PAGE_FIELD]), float(p.score))
                    for p in answer.points]
            results.append(sorted(hits, key=key))
        return results

    def close(self) -> None:
        self.client.close()
