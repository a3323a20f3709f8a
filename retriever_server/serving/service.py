"""The retriever's request handling, without HTTP: validate, search, fetch or crop, render the
answer's bytes in the negotiated format (``contract.JSON`` or ``contract.MSGPACK``, see ``wire``).

A search item's scope (``Backend.search``'s ``Scope``) comes from the request's ``id``: a doc id
(that document), None (the whole corpus) or a list of doc ids (that subset, a ``frozenset``
here); a subset naming an unknown document, or none at all, is that item's error item, checked
before the backend is called.

``RequestError`` marks a request-level problem (the app answers 422; for crops, also more
drawing than ``Limits.max_crop_request_pixels``, checked before anything is drawn),
``AnswerTooLarge`` an answer over ``Limits.max_answer_bytes`` (413: checked before searching,
reading a page or drawing a crop, and on the rendered bytes, see ``answer_size``); item-level
problems become
``{"id": "error", "contents": reason}`` items inside an otherwise normal answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import contract
from ..backends.base import Backend, Hit, Scope
from ..storage.imaging import DEFAULT_JPEG_QUALITY
from ..storage.store import IndexReplacedError
from . import answer_size, regions, wire
from .cache import FragmentCache
from .cropping import Cropper, RegionTooSmall
from .limits import (Limits, doc_problem, fetch_spec_problem, page_problem, parse_fetch_spec,
                     query_problem, subset_problem)

# A request's ``id`` for one search item: a doc id, None (the corpus) or a list of doc ids.
WireScope = str | None | list[str]


def to_scope(entry: WireScope) -> Scope:
    """The backend scope of one wire ``id`` entry: a list becomes a frozenset (maybe empty:
    the service answers that item with an error item)."""
    return frozenset(entry) if isinstance(entry, list) else entry


def _unreadable(exc: Exception) -> str:
    if isinstance(exc, IndexReplacedError):
        return str(exc)
    return f"page could not be read: {type(exc).__name__}"


class RequestError(ValueError):
    """The request as a whole cannot be answered; the message says why."""


class RetrieverService:
    def __init__(self, backend: Backend, cache: FragmentCache, limits: Limits):
        self.backend, self.cache, self.limits = backend, cache, limits
        self.documents: Mapping[str, int] = backend.documents()
        self.budget = answer_size.AnswerBudget(backend, limits.max_answer_bytes)
        store = getattr(backend, "store", None)  # crops are encoded as the index's pages were
        settings = getattr(getattr(store, "manifest", None), "settings", None) or {}
        self.jpeg_quality = int(settings.get("jpeg_quality", DEFAULT_JPEG_QUALITY))

    # -- request-level checks --------------------------------------------------------------
    def doc_ids_for(self, ids: list[str] | str, n: int) -> list[str]:
        if n > self.limits.max_batch:
            raise RequestError(f"batch of {n} items is over the limit of {self.limits.max_batch}; "
                               f"split it")
        if isinstance(ids, str):
            return [ids] * n
        if len(ids) != n:
            raise RequestError(f"'query' has {n} items but 'id' has {len(ids)}; give one doc id "
                               f"per query (or a single string for all)")
        return ids

    def scopes_for(self, ids: list[WireScope] | str | None, n: int) -> list[Scope]:
        """One search scope per query (see ``to_scope``); None: the corpus for every query."""
        if ids is None:
            return self.doc_ids_for([None] * n, n)
        return [to_scope(entry) for entry in self.doc_ids_for(ids, n)]

    def _scope_problem(self, scope: Scope) -> tuple[str, str] | None:
        if scope is None:
            return None
        if isinstance(scope, str):
            problem = doc_problem(scope, self.documents)
            return (problem, contract.UNKNOWN_DOCUMENT) if problem else None
        return subset_problem(scope, self.documents)

    def check_top_n(self, top_n: int) -> None:
        if not 1 <= top_n <= self.limits.max_top_n:
            raise RequestError(f"top_n must be between 1 and {self.limits.max_top_n}, got {top_n}")

    # -- search ----------------------------------------------------------------------------
    def search_items(self, queries: list[str], doc_ids: list[Scope], top_n: int,
                     form: str = contract.JSON) -> list[list[Hit] | tuple[str, str]]:
        """Hits per item, or (reason, contract error code) for an item that cannot be searched.
        ``AnswerTooLarge`` before searching if the answer in ``form`` could be over the limit."""
        out: list[list[Hit] | tuple[str, str]] = [[] for _ in queries]
        todo = []
        for i, (query, doc_id) in enumerate(zip(queries, doc_ids, strict=True)):
            if problem := self._scope_problem(doc_id):
                out[i] = problem
            elif problem := query_problem(query, self.limits):
                out[i] = (problem, contract.MALFORMED_QUERY)
            else:
                todo.append(i)
        self.budget.check_search([doc_ids[i] for i in todo], top_n, form)
        if todo:
            try:
                found = self.backend.search([queries[i] for i in todo],
                                            [doc_ids[i] for i in todo], top_n)
            except Exception:
                found = [self._search_one(queries[i], doc_ids[i], top_n) for i in todo]
            for i, hits in zip(todo, found, strict=True):
                out[i] = hits
        return out

    def _search_one(self, query: str, doc_id: Scope, top_n: int) -> list[Hit] | tuple[str, str]:
        # After a failed batch, retry item by item so one bad item cannot sink the others.
        try:
            return self.backend.search([query], [doc_id], top_n)[0]
        except Exception as exc:  # noqa: BLE001 - reported to the caller as an item error
            return f"search failed: {type(exc).__name__}", contract.UNREADABLE

    def _hits_node(self, hits: list[Hit] | tuple[str, str], with_score: bool, form: str) -> list:
        if not isinstance(hits, tuple):
            try:
                return [wire.HitItem(self.cache.get(hit.doc_id, hit.page, form),
                                 hit.score if with_score else None) for hit in hits]
            except (KeyError, IndexError, OSError) as exc:
                hits = (_unreadable(exc), contract.UNREADABLE)
        return [wire.error_item(*hits)]

    def _search_answer(self, tree: wire.Node, queries: int, top_n: int, form: str) -> bytes:
        return self.budget.check_rendered(
            wire.render(tree, form), form,
            lambda size: answer_size.search_advice(queries, top_n, size, self.budget.max_bytes))

    def batch_search(self, queries: list[str], ids: list[WireScope] | str | None, top_n: int,
                     return_score: bool, form: str = contract.JSON) -> bytes:
        doc_ids = self.scopes_for(ids, len(queries))
        self.check_top_n(top_n)
        return self._search_answer([self._hits_node(hits, return_score, form)
                                    for hits in self.search_items(queries, doc_ids, top_n, form)],
                                   len(queries), top_n, form)

    def search(self, query: str, doc_id: WireScope, top_n: int, return_score: bool,
               form: str = contract.JSON) -> bytes:
        self.check_top_n(top_n)
        scope = to_scope(doc_id)
        return self._search_answer(
            self._hits_node(self.search_items([query], [scope], top_n, form)[0], return_score,
                            form), 1, top_n, form)

    # -- fetch -----------------------------------------------------------------------------
    def _fetch_plan(self, spec: str, doc_id: str) -> tuple[str, int] | dict:
        """(modality, page) of a fetch that can be made, else its error item."""
        parsed = parse_fetch_spec(spec) if len(spec) <= self.limits.max_query_chars else None
        if parsed is None:
            return wire.error_item(fetch_spec_problem(spec), contract.MALFORMED_FETCH)
        if problem := doc_problem(doc_id, self.documents):
            return wire.error_item(problem, contract.UNKNOWN_DOCUMENT)
        if problem := page_problem(doc_id, parsed[1], self.documents):
            return wire.error_item(problem, contract.PAGE_OUT_OF_RANGE)
        return parsed

    def _fetch_node(self, plan: tuple[str, int] | dict, doc_id: str, form: str) -> wire.Node:
        if isinstance(plan, dict):
            return plan
        modality, page = plan
        spec_id = contract.fetch_spec(modality, page)
        try:
            if modality == "text":
                return wire.text_item(spec_id, self.backend.page_text(doc_id, page),
                                      doc_id=doc_id, page=page, mime="text/plain")
            return wire.ImageFetch(spec_id, self.cache.get(doc_id, page, form))
        except (KeyError, IndexError, OSError) as exc:
            return wire.error_item(_unreadable(exc))

    def batch_fetch(self, specs: list[str], ids: list[str] | str,
                    form: str = contract.JSON) -> bytes:
        doc_ids = self.doc_ids_for(ids, len(specs))
        plans = [self._fetch_plan(spec, doc_id)
                 for spec, doc_id in zip(specs, doc_ids, strict=True)]
        images = [(doc_id, plan[1]) for plan, doc_id in zip(plans, doc_ids, strict=True)
                  if not isinstance(plan, dict) and plan[0] == "image"]
        self.budget.check_fetch(images, form)
        tree = [self._fetch_node(plan, doc_id, form)
                for plan, doc_id in zip(plans, doc_ids, strict=True)]
        return self.budget.check_rendered(
            wire.render(tree, form), form,
            lambda size: answer_size.fetch_advice(max(len(images), 1), size,
                                                  self.budget.max_bytes))

    # -- crop ------------------------------------------------------------------------------
    def _crop_plan(self, doc_id: str, page: int, box) -> dict | None:
        """The error item of a crop that cannot be made, else None."""
        if problem := doc_problem(doc_id, self.documents):
            return wire.error_item(problem, contract.UNKNOWN_DOCUMENT)
        if problem := page_problem(doc_id, page, self.documents):
            return wire.error_item(problem, contract.PAGE_OUT_OF_RANGE)
        if problem := contract.box_problem(box):
            return wire.error_item(problem, contract.BAD_BOX)
        return None

    def _crop_node(self, cropper: Cropper, doc_id: str, page: int, box, band: regions.Band,
                   form: str) -> dict:
        try:
            crop = cropper.crop(doc_id, page, box, band)
        except RegionTooSmall as exc:
            return wire.error_item(str(exc), contract.BAD_BOX)
        except Exception as exc:  # noqa: BLE001 - one unreadable page must not sink the batch
            return wire.error_item(_unreadable(exc))
        return wire.image_item(contract.page_id(doc_id, page), crop.jpeg, form, doc_id=doc_id,
                               page=page, mime="image/jpeg", box=[float(v) for v in box],
                               width=crop.width, height=crop.height, source=crop.source)

    def check_crop_cost(self, crops: int, band: regions.Band, form: str) -> None:
        """Refuse, before anything is drawn, ``crops`` crops in ``band`` whose pixels could pass
        ``Limits.max_crop_request_pixels`` (`RequestError`: drawing holds the pdfium lock every
        crop request shares) or whose answer could pass the answer limit (`AnswerTooLarge`). Each
        crop counts at ``band.max_pixels``, the most it can have."""
        pixels, limit = crops * band.max_pixels, self.limits.max_crop_request_pixels
        if pixels > limit:
            fit = contract.crops_per_request(band.max_pixels, limit)
            raise RequestError(f"{crops} crops of up to {band.max_pixels:,} pixels could draw "
                               f"{pixels:,} pixels; the limit is {limit:,} pixels per request (crops "
                               f"are drawn under one lock that every request shares). Send at most "
                               f"{fit} crops per request at this max_pixels, or ask for a smaller "
                               f"max_pixels")
        self.budget.check_crops(crops, band.max_pixels, self.jpeg_quality, form)

    def batch_crop(self, ids: list[str] | str, pages: list[int], boxes: list, band: regions.Band,
                   form: str = contract.JSON) -> bytes:
        """One image (or error item) per crop: ``boxes[i]`` of page ``pages[i]`` of ``ids[i]``,
        in ``band`` (see ``regions`` for the resolution rule, ``cropping`` for the drawing)."""
        n = len(pages)
        if n > self.limits.max_crop_batch:
            raise RequestError(f"batch of {n} crops is over the limit of "
                               f"{self.limits.max_crop_batch}; split it")
        if len(boxes) != n:
            raise RequestError(f"'page' has {n} items but 'box' has {len(boxes)}; give one box "
                               f"per page")
        if isinstance(ids, str):
            ids = [ids] * n
        elif len(ids) != n:
            raise RequestError(f"'page' has {n} items but 'id' has {len(ids)}; give one doc id "
                               f"per crop (or a single string for all)")
        if problem := regions.band_problem(band, self.limits.max_crop_pixels):
            raise RequestError(problem)
        plans = [self._crop_plan(doc_id, page, box)
                 for doc_id, page, box in zip(ids, pages, boxes, strict=True)]
        self.check_crop_cost(sum(plan is None for plan in plans), band, form)  # None: to draw
        with Cropper(self.backend, self.jpeg_quality) as cropper:
            tree = [plan or self._crop_node(cropper, doc_id, page, box, band, form)
                    for plan, doc_id, page, box in zip(plans, ids, pages, boxes, strict=True)]
        return self.budget.check_rendered(
            wire.render(tree, form), form,
            lambda size: answer_size.crop_advice(n, size, self.budget.max_bytes))
