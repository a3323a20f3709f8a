"""Page-image retriever: index PDFs and page images, search the whole corpus, a subset of documents
or one document, fetch a page.

Layers, lowest first; each imports only those before it (tests/test_layers.py checks it):

- `contract`: the wire contract (ids, forms, error codes, box rules); standard library only, and
  the one module the rollout's client (`vrag_rollout.retrieval`) imports.
- `storage`: the index directory on disk: manifest, read side, crash-safe swap, page imaging.
- `encoders`: page and query encoders for dense retrieval (ColQwen2).
- `backends`: search behind one interface: BM25, Qdrant multi-vector, their fusion.
- `indexing`: building an index from documents (ingest, OCR, headings, page roles, BM25, dense).
- `serving`: answering requests without HTTP: search, fetch, crop, caching, limits, index reloads.
- `api`: the HTTP surface: FastAPI routes, schemas, admission control, metrics, app factories.
- `cli`: the `vrag-retriever` command (index, serve, sample-corpus), over all of the above.
- `sample_corpus`: a small deterministic sample corpus (three PDFs) with the facts on each page,
  for tests and demos; imports nothing of the package.
"""
