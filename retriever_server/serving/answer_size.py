"""The cap on an answer's size (``Limits.max_answer_bytes``), enforced before the work is done.

An answer is mostly page images, whose sizes the index records (``Backend.image_sizes``), so
the largest answer a request can produce is known from the request alone: for each query
searched, the ``top_n`` largest pages of its scope (all of them when it has fewer: search
answers ``min(top_n, pages)`` hits): of its document, of its subset of documents (their
largest-first lists merged), or of the whole index (one largest-first list, made once per
index on the first corpus search); for each image fetch, that page. In the negotiated form: JSON
carries base64 (4 bytes per 3), MessagePack the JPEG bytes. `AnswerBudget` refuses a request
whose bound is over the limit (`AnswerTooLarge`, a 413 saying how to stay under it) before any
search or page read. Items the service answers with an error item are not searched, not counted.

The bound counts each page item's other fields (id, doc_id, page, mime, role, headings) as
`ITEM_ALLOWANCE` bytes, and a backend may not know its sizes, so the rendered answer is
measured too (`check_rendered`): an answer over the limit is refused whole, never cut short.
Crops are drawn per request, their JPEG sizes unknown before: each is bounded by its worst case,
the band's ``max_pixels`` at the densest rate a JPEG of the index's quality was measured at
(`worst_jpeg_bytes`), so a request that could go over is refused before anything is drawn
(`check_crops`); the drawn answer is measured as well.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from itertools import accumulate, islice

from .. import contract
from ..backends.base import Backend, Scope

ITEM_ALLOWANCE = 512  # bytes of a page item besides its image (a few headings, the framing)
LIMIT_OPTION = "--max-answer-mib"  # ``vrag-retriever serve``'s option that sets the limit
MIB = 2**20
# Bytes per pixel of the densest JPEG ``imaging.encode_jpeg`` wrote at each quality, rounded up:
# random black-and-white noise in each colour channel, 1008 x 1008 (measured 0.37, 0.56, 0.77,
# 0.95, 1.11, 1.42 at these qualities; 1.54-2.3 from 96 to 100). Pages and their crops are far
# below (the sample corpus at 85: pages about 0.2, full-page crops 0.04). As (up to quality,
# bytes per pixel), in order.
WORST_JPEG_DENSITY = ((25, 0.40), (50, 0.60), (75, 0.80), (85, 1.00), (90, 1.17), (95, 1.50),
                      (100, 2.40))
JPEG_OVERHEAD = 1024  # a JPEG's headers and tables (about 600 bytes) with room


def worst_jpeg_bytes(pixels: int, quality: int) -> int:
    """The most bytes a JPEG of ``pixels`` pixels at ``quality`` (1..100) was measured to take."""
    density = next((d for q, d in WORST_JPEG_DENSITY if quality <= q), WORST_JPEG_DENSITY[-1][1])
    return math.ceil(pixels * density) + JPEG_OVERHEAD


class AnswerTooLarge(ValueError):
    """The answer would be (or is) over the server's limit; the message says how to fit."""


def _size(nbytes: int) -> str:
    if nbytes < MIB:
        return f"{nbytes:,} bytes"
    return f"{nbytes / MIB:,.1f}".removesuffix(".0") + " MiB"


def _form_name(form: str) -> str:
    return "MessagePack" if form == contract.MSGPACK else "JSON"


def _image_bytes(nbytes: int, count: int, form: str) -> int:
    """Bytes of ``count`` images of ``nbytes`` JPEG bytes in all, as the answer carries them."""
    if form == contract.JSON:
        nbytes = (4 * nbytes + 8 * count) // 3  # base64: 4 per 3, each image padded
    return nbytes + count * ITEM_ALLOWANCE


class AnswerBudget:
    def __init__(self, backend: Backend, max_bytes: int):
        self.backend, self.max_bytes = backend, max_bytes
        # Per doc_id, filled on first use (a race computes the same lists twice, harmlessly):
        # each page's image bytes, and [bytes of its largest page, of its 2 largest, ...].
        # None: the backend does not know.
        self._sizes: dict[str, Sequence[int] | None] = {}
        self._largest: dict[str, list[int] | None] = {}
        self._descending: dict[str, list[int] | None] = {}  # each page's bytes, largest first
        self._corpus: list[int] | None | bool = False  # the index's ``_largest``; False: not yet

    def _page_sizes(self, doc_id: str) -> Sequence[int] | None:
        if doc_id not in self._sizes:
            self._sizes[doc_id] = self.backend.image_sizes(doc_id)
        return self._sizes[doc_id]

    def _largest_first(self, doc_id: str) -> list[int] | None:
        if doc_id not in self._largest:
            sizes = self._page_sizes(doc_id)
            self._largest[doc_id] = (None if sizes is None
                                     else list(accumulate(sorted(sizes, reverse=True))))
        return self._largest[doc_id]

    def _sorted_sizes(self, doc_id: str) -> list[int] | None:
        if doc_id not in self._descending:
            sizes = self._page_sizes(doc_id)
            self._descending[doc_id] = None if sizes is None else sorted(sizes, reverse=True)
        return self._descending[doc_id]

    def _corpus_largest(self) -> list[int] | None:
        """``_largest_first`` of the whole index: made once (about 20 ms at 20,000 pages)."""
        if self._corpus is False:
            lists = [self._sorted_sizes(d) for d in self.backend.documents()]
            self._corpus = (None if any(s is None for s in lists)
                            else list(accumulate(heapq.merge(*lists, reverse=True))))
        return self._corpus

    def _scope_bound(self, scope: Scope, top_n: int) -> tuple[int, int] | None:
        """(image bytes, images) of the largest answer to one query in ``scope``; None when
        the backend does not know its sizes."""
        if isinstance(scope, str) or scope is None:
            largest = self._largest_first(scope) if scope is not None else self._corpus_largest()
            if largest is None:
                return None
            k = min(top_n, len(largest))
            return (largest[k - 1], k) if k else (0, 0)
        lists = [self._sorted_sizes(d) for d in scope]
        if any(s is None for s in lists):
            return None
        # Only the first top_n of the merged lists are read: cheap for any subset.
        top = list(islice(heapq.merge(*lists, reverse=True), top_n))
        return sum(top), len(top)

    def check_search(self, doc_ids: Sequence[Scope], top_n: int, form: str) -> None:
        """Refuse searching ``doc_ids`` (one scope per query that will be searched: a doc id,
        None for the corpus, or a collection of doc ids) at ``top_n`` if the answer could go
        over the limit."""
        nbytes = images = 0
        for doc_id in doc_ids:
            bound = self._scope_bound(doc_id, top_n)
            if bound is None:
                return  # unknown sizes: measured once rendered
            nbytes, images = nbytes + bound[0], images + bound[1]
        bound = _image_bytes(nbytes, images, form)
        if bound > self.max_bytes:
            raise self._refusal(f"would hold up to {images:,} page images, up to "
                                f"{_size(bound)}", form, search_advice(len(doc_ids), top_n,
                                                                          bound, self.max_bytes))

    def check_fetch(self, pages: Sequence[tuple[str, int]], form: str) -> None:
        """Refuse fetching the images of ``pages`` ((doc_id, 1-based page), in range) if the
        answer could go over the limit."""
        nbytes = 0
        for doc_id, page in pages:
            sizes = self._page_sizes(doc_id)
            if sizes is None:
                return
            nbytes += sizes[page - 1]
        bound = _image_bytes(nbytes, len(pages), form)
        if bound > self.max_bytes:
            raise self._refusal(f"would hold {len(pages):,} page images, up to {_size(bound)}",
                                form, fetch_advice(len(pages), bound, self.max_bytes))

    def check_crops(self, crops: int, max_pixels: int, quality: int, form: str) -> None:
        """Refuse drawing ``crops`` crops of up to ``max_pixels`` pixels each, encoded as JPEG at
        ``quality``, if the answer could go over the limit (each at `worst_jpeg_bytes`)."""
        bound = _image_bytes(crops * worst_jpeg_bytes(max_pixels, quality), crops, form)
        if bound > self.max_bytes:
            raise self._refusal(f"could hold {crops:,} crops of up to {max_pixels:,} pixels, up to "
                                f"{_size(bound)}", form, crop_advice(crops, bound, self.max_bytes))

    def check_rendered(self, data: bytes, form: str, advice: Callable[[int], str]) -> bytes:
        """``data`` if within the limit; else `AnswerTooLarge` (``advice(size)`` says what to ask
        for instead)."""
        if len(data) > self.max_bytes:
            measured = f"is {len(data):,} bytes" + (f" ({_size(len(data))})"
                                                    if len(data) >= MIB else "")
            raise self._refusal(measured, form, advice(len(data)))
        return data

    def _refusal(self, what: str, form: str, advice: str) -> AnswerTooLarge:
        smaller = (f" MessagePack answers ('accept: {contract.MSGPACK}') are a quarter smaller."
                   if form == contract.JSON else "")
        return AnswerTooLarge(f"this answer {what} as {_form_name(form)}; the limit is "
                              f"{_size(self.max_bytes)} per answer (the server's "
                              f"{LIMIT_OPTION}). {advice}.{smaller}")


def _fits(count: int, size: int, limit: int) -> int:
    """How many of ``count`` items of ``size`` bytes in all fit in ``limit`` (about)."""
    return int(limit / (size / count)) if count and size else 0


def search_advice(queries: int, top_n: int, size: int, limit: int) -> str:
    fit = _fits(queries, size, limit)
    if fit == 0:
        return f"One query at top_n={top_n} is over it: ask for a smaller top_n"
    return (f"Send fewer queries per request (at most about {fit:,} at top_n={top_n}) or ask "
            f"for a smaller top_n")


def fetch_advice(pages: int, size: int, limit: int) -> str:
    fit = _fits(pages, size, limit)
    return f"Fetch fewer pages per request (at most about {max(fit, 1):,})"


def crop_advice(crops: int, size: int, limit: int) -> str:
    fit = _fits(crops, size, limit)
    return (f"Crop fewer regions per request (at most about {max(fit, 1):,}) or ask for a "
            f"smaller max_pixels")
