"""backends.late_interaction: first stage + exact MaxSim re-rank, against brute-force MaxSim."""

from __future__ import annotations

import numpy as np
import pytest

from retriever_server.backends.late_interaction import LateInteractionIndex
from retriever_server.encoders.base import maxsim


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _corpus(n=300, dim=32, seed=0):
    """Pages of 10-40 vectors, each page drawn around a few directions of its own."""
    rng = np.random.default_rng(seed)
    pages = []
    for _ in range(n):
        topics = rng.standard_normal((3, dim))
        rows = topics[rng.integers(3, size=rng.integers(10, 41))]
        pages.append(_unit(rows + 0.5 * rng.standard_normal(rows.shape)))
    return pages


def _queries(pages, count=32, seed=1):
    rng = np.random.default_rng(seed)
    targets = rng.choice(len(pages), count, replace=False)
    return [_unit(pages[t][rng.choice(len(pages[t]), 8)]
                  + 0.3 * rng.standard_normal((8, pages[0].shape[1]))) for t in targets]


def _exact(pages, q, rows=None):
    rows = range(len(pages)) if rows is None else rows
    scored = [(r, maxsim(q, pages[r])) for r in rows]
    return sorted(scored, key=lambda rs: (-rs[1], rs[0]))


def test_scores_are_exact_maxsim_and_recall_is_high():
    pages = _corpus()
    index = LateInteractionIndex.from_pages(pages, candidates=60)
    recalls = []
    for q, hits in zip(queries := _queries(pages), index.search(queries, 10)):
        for row, score in hits:
            assert score == pytest.approx(maxsim(q, pages[row]), rel=1e-5)
        truth = {r for r, _ in _exact(pages, q)[:10]}
        recalls.append(len(truth & {r for r, _ in hits}) / 10)
    assert np.mean(recalls) >= 0.9


def test_enough_candidates_is_exact():
    pages = _corpus(n=80)
    index = LateInteractionIndex.from_pages(pages, candidates=80)
    for q, hits in zip(queries := _queries(pages, 8), index.search(queries, 5)):
        expect = _exact(pages, q)[:5]
        assert [r for r, _ in hits] == [r for r, _ in expect]
        assert [s for _, s in hits] == pytest.approx([s for _, s in expect], rel=1e-5)


def test_order_and_ties_by_row():
    pages = _corpus(n=20)
    pages[7] = pages[3].copy()
    pages[15] = pages[3].copy()
    index = LateInteractionIndex.from_pages(pages, candidates=4)
    q = pages[3][:5]
    hits = index.search([q], 5)[0]
    assert [r for r, _ in hits[:3]] == [3, 7, 15]  # equal scores: ascending row
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True)


def test_subset_only_returns_subset_rows():
    pages = _corpus(n=200)
    index = LateInteractionIndex.from_pages(pages, candidates=30)
    queries = _queries(pages, 8)
    subset = np.arange(5, 200, 3)
    mask = np.zeros(len(pages), bool)
    mask[subset] = True
    for rows in (subset, mask, list(subset)):
        for hits in index.search(queries, 10, rows=rows):
            assert len(hits) == 10 and {r for r, _ in hits} <= set(subset.tolist())
    small = [4, 150, 9]  # fewer rows than candidates: exact over them
    for q, hits in zip(queries, index.search(queries, 10, rows=small)):
        assert hits == [(r, pytest.approx(s, rel=1e-5)) for r, s in _exact(pages, q, small)]
    assert index.search(queries[:1], 3, rows=np.zeros(len(pages), bool)) == [[]]


def test_fewer_pages_than_top_n():
    pages = _corpus(n=4)
    index = LateInteractionIndex.from_pages(pages)
    q = _queries(pages, 1)[0]
    hits = index.search([q], 10)[0]
    assert [r for r, _ in hits] == [r for r, _ in _exact(pages, q)]
    assert index.search([], 3) == []


def test_rejects_bad_input():
    pages = _corpus(n=5)
    index = LateInteractionIndex.from_pages(pages)
    with pytest.raises(ValueError, match="non-empty"):
        index.search([np.zeros((0, 32), np.float32)], 3)
    with pytest.raises(ValueError, match="non-empty"):
        index.search([np.ones((2, 16), np.float32)], 3)
    with pytest.raises(ValueError, match="top_n"):
        index.search([pages[0]], 0)
    with pytest.raises(ValueError, match="out of range"):
        index.search([pages[0]], 3, rows=[0, 5])
    with pytest.raises(ValueError, match="mask"):
        index.search([pages[0]], 3, rows=np.ones(3, bool))
    with pytest.raises(ValueError):
        LateInteractionIndex.from_pages([])
    with pytest.raises(ValueError):  # a page without vectors
        LateInteractionIndex(np.ones((3, 4), np.float32), np.array([0, 3, 3]))


def test_pooled_first_stage_and_projection_build():
    pages = _corpus(n=50)
    for options in (dict(bits=0, repetitions=1), dict(bits=3, repetitions=4, proj_dim=8)):
        index = LateInteractionIndex.from_pages(pages, candidates=20, **options)
        assert index.pages.shape[0] == 50
        hits = index.search(_queries(pages, 4), 5)
        assert all(len(h) == 5 for h in hits)
