"""Shared, cached builds for the dense-retrieval tests: the tiny ColQwen2 and a Qdrant index."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from retriever_server.encoders.tiny import build_tiny_colqwen2
from retriever_server.indexing.indexer import build_index
from retriever_server.sample_corpus import write_sample_corpus


@functools.cache
def tiny_colqwen2(base: Path, seed: int = 0) -> Path:
    return build_tiny_colqwen2(base / f"tiny-colqwen2-{seed}", seed=seed)


@functools.cache
def dense_index(base: Path, search: str = "dense") -> Path:
    """The sample corpus (3 PDFs, 13 pages) in Qdrant local mode, encoded by the tiny ColQwen2."""
    pdfs = write_sample_corpus(base / f"corpus-{search}")
    return build_index(pdfs, base / f"qdrant-{search}", progress=False,
                       encoder=f"colqwen2:{tiny_colqwen2(base)}", search=search,
                       min_pixels=64 * 28 * 28, max_pixels=128 * 28 * 28)


@contextmanager
def opened_copy(base: Path, name: str, search: str = "dense") -> Iterator:
    """The backend of a private copy of the shared dense index (Qdrant's local mode lets one
    client open a folder), closed on exit."""
    from retriever_server.backends import open_backend

    backend = open_backend(shutil.copytree(dense_index(base, search=search), base / name))
    try:
        yield backend
    finally:
        backend.close()
