"""Late-interaction (MaxSim) search at corpus scale: a fixed-dimensional first stage, then exact
MaxSim on its candidates.

Contract:

- Pages are rows ``0..n-1``. Row ``r``'s multi-vector is ``vectors[offsets[r]:offsets[r + 1]]``
  (one ``(total_tokens, dim)`` matrix and ``n + 1`` offsets, as the encoders' arrays stacked in
  row order). Every page has at least one vector. Nothing is copied: a memory-mapped matrix
  (float32 or float16) stays on disk until its candidates are read.
- ``search(queries, top_n, rows=None)`` returns, per query, at most ``top_n`` ``(row, score)``
  pairs, score descending, equal scores by ascending row. ``score`` is always the exact MaxSim
  ``sum_i max_j <q_i, p_j>`` (``encoders.base.maxsim``); only *which* rows get scored is
  approximate. ``rows`` (indices or a boolean mask over all rows) restricts the search to a
  subset: only those rows are returned. Where the subset (or the corpus) has at most
  ``candidates`` rows, every one of them is scored exactly, so the answer is exact.
- First stage: each page becomes one fixed-dimensional vector (a MUVERA-style encoding, after
  Dhulipala et al. 2024, "MUVERA: Multi-Vector Retrieval via Fixed Dimensional Encodings"):
  ``repetitions`` random partitions of the vector space by ``bits`` hyperplanes; per partition
  cell, the mean of the page's vectors in that cell (an empty cell takes the mean of the page's
  vectors in the nearest cells, by Hamming distance of the cell codes), optionally projected to
  ``proj_dim`` dimensions. A query's encoding sums its vectors per cell instead, so the inner
  product of the two approximates MaxSim. ``bits=0, repetitions=1`` is plain mean pooling.
  The first stage is an exact inner product over all (or the subset's) rows, by matrix product:
  no graph, no training, deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_CHUNK_VECTORS = 1 << 14  # vectors per step when encoding pages: bounds the temporary arrays


class LateInteractionIndex:
    def __init__(self, vectors: np.ndarray, offsets: np.ndarray, *, repetitions: int = 8,
                 bits: int = 4, proj_dim: int | None = None, candidates: int = 256,
                 seed: int = 0, first_stage_dtype=np.float16):
        offsets = np.asarray(offsets, dtype=np.int64)
        if vectors.ndim != 2 or offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 \
                or offsets[-1] != len(vectors) or np.any(np.diff(offsets) <= 0):
            raise ValueError("vectors must be (tokens, dim) and offsets 0 = o_0 < o_1 < ... = tokens")
        if repetitions < 1 or not 0 <= bits <= 10 or candidates < 1:
            raise ValueError("need repetitions >= 1, 0 <= bits <= 10, candidates >= 1")
        self.vectors, self.offsets, self.candidates = vectors, offsets, candidates
        self.dim = vectors.shape[1]
        self.bits, self.repetitions = bits, repetitions
        self.proj_dim = proj_dim or self.dim
        rng = np.random.default_rng(seed)
        # Cells are cut through the corpus mean, not the origin: encoder outputs crowd into one
        # narrow cone, and hyperplanes through the origin would put nearly every vector in one cell.
        self.center = self._mean_vector()
        self.planes = rng.standard_normal((repetitions, self.dim, bits)).astype(np.float32)
        self.projections = None
        if self.proj_dim != self.dim:  # random +-1 projections (MUVERA's inner projection)
            signs = rng.integers(0, 2, (repetitions, self.dim, self.proj_dim)) * 2 - 1
            self.projections = (signs / np.sqrt(self.proj_dim)).astype(np.float32)
        self.pages = self._encode_pages().astype(first_stage_dtype)

    @classmethod
    def from_pages(cls, pages: Sequence[np.ndarray], **options) -> "LateInteractionIndex":
        """Build from one ``(tokens, dim)`` array per page, in row order."""
        if not pages:
            raise ValueError("no pages")
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in pages])])
        return cls(np.concatenate(pages).astype(np.float32, copy=False), offsets, **options)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def first_stage_bytes(self) -> int:
        return self.pages.nbytes

    # -- encodings --------------------------------------------------------------------------

    def _mean_vector(self) -> np.ndarray:
        total = np.zeros(self.dim, dtype=np.float64)
        for start in range(0, len(self.vectors), _CHUNK_VECTORS):
            total += self.vectors[start:start + _CHUNK_VECTORS].astype(np.float64).sum(0)
        return (total / len(self.vectors)).astype(np.float32)

    def _cells(self, x: np.ndarray, r: int) -> np.ndarray:
        """Cell code of each row of ``x`` in partition ``r``."""
        above = (x @ self.planes[r]) > 0  # x centred
        return (above.astype(np.int64) << np.arange(self.bits)).sum(1) if self.bits else \
            np.zeros(len(x), dtype=np.int64)

    def _project(self, x: np.ndarray, r: int) -> np.ndarray:
        return x if self.projections is None else x @ self.projections[r]

    def _encode_pages(self) -> np.ndarray:
        cells = 1 << self.bits
        codes = np.arange(cells)
        # Hamming distance between every pair of cell codes.
        hamming = np.array([[bin(a ^ b).count("1") for b in codes] for a in codes])
        out = np.zeros((len(self), self.repetitions, cells, self.proj_dim), dtype=np.float32)
        # Whole pages per chunk, so a page's cells are complete within one step.
        bounds = [0]
        for row in range(1, len(self) + 1):
            if self.offsets[row] - self.offsets[bounds[-1]] >= _CHUNK_VECTORS or row == len(self):
                bounds.append(row)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            starts = self.offsets[lo:hi] - self.offsets[lo]
            x = np.asarray(self.vectors[self.offsets[lo]:self.offsets[hi]], dtype=np.float32)
            page_of = np.repeat(np.arange(hi - lo), np.diff(self.offsets[lo:hi + 1]))
            # Centred for the cells; the cell means may stay centred, since shifting every page
            # vector by one vector moves every page's score by the same amount.
            x = x - self.center
            for r in range(self.repetitions):
                dist = hamming[self._cells(x, r)]  # (vectors, cells)
                nearest = np.minimum.reduceat(dist, starts, axis=0)[page_of]
                # Weight 1/count on the page's vectors nearest to each cell: for a non-empty cell
                # these are the cell's own vectors, so this is the cell mean.
                weight = (dist == nearest).astype(np.float32)
                weight /= np.add.reduceat(weight, starts, axis=0)[page_of]
                y = self._project(x, r)
                out[lo:hi, r] = np.add.reduceat(weight[:, :, None] * y[:, None, :], starts, axis=0)
        return out.reshape(len(self), -1)

    def encode_query(self, query: np.ndarray) -> np.ndarray:
        """The query's fixed-dimensional encoding (its vectors summed per cell)."""
        cells = 1 << self.bits
        out = np.zeros((self.repetitions, cells, self.proj_dim), dtype=np.float32)
        for r in range(self.repetitions):
            np.add.at(out[r], self._cells(query - self.center, r), self._project(query, r))
        return out.reshape(-1)

    # -- search -----------------------------------------------------------------------------

    def maxsim(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact MaxSim of one query against the given rows."""
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        picked = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
        sims = query @ np.asarray(self.vectors[picked], dtype=np.float32).T
        bounds = np.concatenate([[0], np.cumsum(ends - starts)[:-1]])
        return np.maximum.reduceat(sims, bounds, axis=1).sum(0)

    def _subset(self, rows) -> np.ndarray:
        if rows is None:
            return np.arange(len(self))
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (len(self),):
                raise ValueError(f"row mask has shape {rows.shape}, expected ({len(self)},)")
            return np.flatnonzero(rows)
        rows = np.unique(rows.astype(np.int64))
        if len(rows) and (rows[0] < 0 or rows[-1] >= len(self)):
            raise ValueError(f"rows out of range 0..{len(self) - 1}")
        return rows

    def search(self, queries: Sequence[np.ndarray], top_n: int, *, rows=None,
               candidates: int | None = None) -> list[list[tuple[int, float]]]:
        """Per query, the ``top_n`` best ``(row, exact MaxSim)`` among ``rows`` (all by default)."""
        if top_n < 1:
            raise ValueError("top_n must be at least 1")
        for q in queries:
            if q.ndim != 2 or q.shape[0] == 0 or q.shape[1] != self.dim:
                raise ValueError(f"each query must be a non-empty (tokens, {self.dim}) array")
        subset = self._subset(rows)
        k = max(candidates or self.candidates, top_n)
        if len(subset) == 0 or not queries:
            return [[] for _ in queries]
        if len(subset) > k:  # first stage: one matrix product for the whole batch
            encoded = np.stack([self.encode_query(np.asarray(q, np.float32)) for q in queries])
            first = encoded @ self.pages[subset].astype(np.float32).T
        results = []
        for i, q in enumerate(queries):
            cand = subset if len(subset) <= k else np.sort(_top(first[i], subset, k))
            scores = self.maxsim(np.asarray(q, np.float32), cand)
            best = _top(scores, cand, top_n)
            results.append([(int(r), float(s)) for r, s in
                            zip(best, scores[np.searchsorted(cand, best)])])
        return results


def _top(scores: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` rows (``rows`` ascending) with the highest scores, best first, ties by row."""
    if len(rows) > k:  # cut to the k best first; rows tied at the cut-off: the lowest ones
        cut = np.partition(scores, len(scores) - k)[len(scores) - k]
        above = np.flatnonzero(scores > cut)
        tied = np.flatnonzero(scores == cut)[:k - len(above)]
        keep = np.concatenate([above, tied])
        scores, rows = scores[keep], rows[keep]
    return rows[np.lexsort((rows, -scores))]
