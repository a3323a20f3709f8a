"""The identity of the index an evaluation searches, as `results.jsonl`'s header records it. Pure.

The index is the search space of a corpus-scope run and the pages of a document-scope one: a
resumed evaluation against another index would average two experiments into one report, so the
header records the index and a resume against another one is refused (`evaluation.results`).

The identity is what the retriever itself reports about its index (`retriever_server`):

- `version`: its content version, the one `GET /ready` reports (`index_version`) and every
  answer carries (`X-Index-Version`): the first 16 hex digits of the SHA-256 of the index's
  manifest (its documents, pages, page images, indexing settings and backend, encoder
  included), the same whether the index is served here (`--index`) or by a running server;
- `documents`, `pages`: how many it holds (`GET /health`).

`from_manifest(manifest_json, page_counts)` computes it from an index directory's manifest;
`from_server(ready, health, listing, url)` from a running server's answers (None for a route
that did not answer). A server that reports none of them (not this project's retriever) is
identified by its `url` alone, so only another server is refused then.
"""

from __future__ import annotations

import hashlib
from typing import Mapping, Optional

VERSION_DIGITS = 16  # as retriever_server.serving.lifecycle.index_version


def from_manifest(manifest_json: str, page_counts: Mapping[str, int]) -> dict:
    version = hashlib.sha256(manifest_json.encode()).hexdigest()[:VERSION_DIGITS]
    return {"version": version, "documents": len(page_counts), "pages": sum(page_counts.values())}


def from_server(ready: Optional[dict], health: Optional[dict], listing: Optional[dict], url: str) -> dict:
    version = (ready or {}).get("index_version") if isinstance(ready, dict) else None
    documents = pages = None
    if isinstance(health, dict) and isinstance(health.get("documents"), int):
        documents, pages = health["documents"], health.get("pages")
    elif isinstance(listing, dict) and isinstance(listing.get("documents"), list):
        counts = [doc.get("num_pages") for doc in listing["documents"] if isinstance(doc, dict)]
        documents, pages = len(counts), sum(n for n in counts if isinstance(n, int))
    if version is None and documents is None:
        return {"url": url}
    return {"version": version, "documents": documents, "pages": pages}


__all__ = ["from_manifest", "from_server"]
