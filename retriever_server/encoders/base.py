"""The encoder interface: page images and queries -> multi-vector embeddings.

Contract: ``encode_images`` and ``encode_queries`` return one float32 array of shape
(tokens, dim) per input, in input order, with padding tokens removed; rows are L2-normalised, so
a page's relevance to a query is the MaxSim (late interaction) score

    score(q, p) = sum over query rows i of max over page rows j of <q_i, p_j>.

Both methods may be called from many threads at once. ``close()`` releases what an encoder
started (worker processes, threads); an encoder never closed releases them at interpreter exit.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

# Bytes read from each end of a weight file for the fingerprint: cheap on multi-GB checkpoints,
# and a retrained or swapped checkpoint differs there (tensors and the safetensors header).
_FINGERPRINT_SPAN = 4 * 1024 * 1024
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def checkpoint_fingerprint(path: Path) -> str:
    """A short hash of a checkpoint directory: config.json, and each weight file's size and ends."""
    digest = hashlib.sha256()
    path = Path(path)
    digest.update((path / "config.json").read_bytes())
    for weights in sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
        size = weights.stat().st_size
        digest.update(f"{weights.name}:{size}".encode())
        with weights.open("rb") as f:
            digest.update(f.read(_FINGERPRINT_SPAN))
            if size > 2 * _FINGERPRINT_SPAN:
                f.seek(size - _FINGERPRINT_SPAN)
                digest.update(f.read(_FINGERPRINT_SPAN))
    return digest.hexdigest()[:16]


class PageEncoder(ABC):
    name: str
    dim: int
    spec: str  # "NAME:PATH", as given to load_encoder
    fingerprint: str  # "NAME:<checkpoint hash>"

    @abstractmethod
    def encode_images(self, jpegs: list[bytes]) -> list[np.ndarray]:
        """One (tokens, dim) float32 array per page image (JPEG bytes)."""

    @abstractmethod
    def encode_queries(self, queries: list[str]) -> list[np.ndarray]:
        """One (tokens, dim) float32 array per query."""

    def close(self) -> None:
        """Release what the encoder started (worker processes, threads); idempotent."""


def maxsim(query: np.ndarray, page: np.ndarray) -> float:
    """The late-interaction score of one query against one page (reference implementation)."""
    return float((query @ page.T).max(axis=1).sum())
