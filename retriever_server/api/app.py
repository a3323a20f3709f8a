"""FastAPI routes speaking the existing retriever wire format (see docs/retriever.md).

Routing, auth and error mapping only; the work is in ``service.RetrieverService``, admission
control in ``admission``, the swappable index in ``lifecycle``, metrics in ``metrics``. Request-level
problems (malformed JSON, wrong types, batch too large, top_n out of range) are 422s with a
readable ``detail`` (``problems``); a body not sent as JSON is a 415 naming the header to send;
an answer over ``Limits.max_answer_bytes`` is a 413 (``answer_size``); item-level problems are
error items inside a normal 200 answer.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader
from pydantic import BaseModel

from ..contract import JSON, MSGPACK, prefers_msgpack
from ..serving.answer_size import AnswerTooLarge
from ..serving.cache import DEFAULT_CACHE_BYTES
from ..serving.lifecycle import VERSION_HEADER, IndexSlot, LoadedIndex
from ..serving.limits import Limits
from ..serving.regions import Band
from ..serving.service import RequestError
from . import problems as request_problems
from .admission import AdmissionGate, AdmissionLimits, AdmissionMiddleware, ComputeThreads
from .metrics import ServerMetrics
from .schemas import (BatchCropRequest, BatchFetchRequest, BatchSearchRequest, DocumentList,
                      FetchRequest, Health, Item, Problem, SearchRequest)

API_KEY_HEADER = "X-API-Key"
# Routes that do the work and therefore pass admission control; the rest never queue.
GATED_ROUTES = frozenset({"/batch_search", "/search", "/batch_fetch", "/fetch", "/batch_crop"})
_KNOWN_ROUTES = GATED_ROUTES | {"/health", "/ready", "/metrics", "/documents", "/admin/reload"}


class ReloadRequest(BaseModel):
    index: str | None = None  # an index directory; default: the one served now


class _BodyLimit:
    """Pure ASGI guard: refuse bodies whose declared length is over the limit, before reading."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                    response = JSONResponse(
                        {"detail": f"request body over {self.max_bytes} bytes"}, status_code=413)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _api_key_dependency(api_key: str | None) -> Callable:
    header = APIKeyHeader(name=API_KEY_HEADER, auto_error=False)

    def check(supplied: str | None = Depends(header)) -> None:
        if api_key is None:
            return
        if supplied is None or not hmac.compare_digest(supplied.encode(), api_key.encode()):
            raise HTTPException(status_code=401, detail=f"missing or wrong {API_KEY_HEADER} header")

    return check


def _answer(loaded: LoadedIndex, form: str, make: Callable[[], bytes]) -> Response:
    # The header names the index that produced this answer (it may change on a live reload);
    # Vary: the same URL answers JSON or MessagePack by the request's Accept.
    headers = {VERSION_HEADER: loaded.version, "Vary": "Accept"}
    try:
        return Response(make(), media_type=form, headers=headers)
    except AnswerTooLarge as exc:  # refused whole: never a partial answer
        return JSONResponse({"detail": str(exc)}, status_code=413, headers=headers)
    except RequestError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=422, headers=headers)


def create_app(source, *, api_key: str | None = None, limits: Limits | None = None,
               cache_bytes: int = DEFAULT_CACHE_BYTES, preload: bool | str = False,
               admission: AdmissionLimits | None = None,
               follow_index_s: float | None = None) -> FastAPI:
    """The retriever app over an index dir, a ``PageStore`` or any ``Backend``.

    ``api_key``: require ``X-API-Key`` on every route but /health and /ready. ``preload``: read
    every page into the image cache now instead of on first use (True: in the form the rollout
    client asks for; ``"json"`` or ``"msgpack"``: in that form). ``admission``: how much work
    may run and wait at once (see ``admission.AdmissionLimits``). ``follow_index_s``: notice a
    re-index of the served path within about that many seconds and reload by itself
    (``lifecycle.IndexSlot``); default: only ``POST /admin/reload`` switches indexes.
    """
    gate = AdmissionGate(admission or AdmissionLimits())
    compute = ComputeThreads(gate.limits.threads)
    metrics = ServerMetrics(queue_depth=lambda: gate.queued, in_flight=lambda: gate.in_flight)
    slot = IndexSlot(source, limits=limits or Limits(), cache_bytes=cache_bytes, preload=preload,
                     on_load=lambda x: metrics.index_loaded(x.version, x.path or "", x.backend_name,
                                                            x.documents, x.pages),
                     follow_s=follow_index_s)
    auth = [Depends(_api_key_dependency(api_key))]
    problems = {code: {"model": Problem, "description": text} for code, text in [
        (401, "missing or wrong API key"),
        (413, "request body too large, or the answer could be (fewer queries or a smaller "
              "top_n fit; fewer crops or a smaller max_pixels)"),
        (415, "request body not sent as JSON (content-type: application/json)"),
        (422, "malformed request: malformed JSON, wrong types, batch too large, top_n out of "
              "range, a crop's pixel band out of range, crops that could draw more pixels than "
              "the server's limit per request"),
        (503, "overloaded: retry after the Retry-After header's seconds (Retry-After-Ms: the "
              "same, in milliseconds)")]}
    # strict_content_type=False: a body without a content-type header is read as JSON; one sent
    # as another type (curl -d alone sends a form type) is a 415 saying so (``problems``).
    app = FastAPI(title="vrag-retriever", version="1", strict_content_type=False,
                  description="Page-image retriever: search one document, a set of documents "
                              "or the whole corpus (`id` absent or null), fetch a page. Page ids "
                              "are `<doc_id>_<page>` with 1-based pages. Answers are JSON (images "
                              "as base64 text), or MessagePack with each image's JPEG bytes as a "
                              "`bin` when `Accept` prefers `application/msgpack`.")
    app.state.index = slot
    app.state.gate = gate
    app.state.metrics = metrics
    app.add_middleware(_BodyLimit, max_bytes=slot.current.service.limits.max_body_bytes)
    # Outermost: refusals are cheap and never reach routing; every answer is counted.
    app.add_middleware(AdmissionMiddleware, gate=gate, gated=GATED_ROUTES, known=_KNOWN_ROUTES,
                       observe=metrics.observe, refused=metrics.refused)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = request_problems.describe(exc, request.headers.get("content-type"))
        return JSONResponse(status_code=status, content={"detail": detail})

    # async: answered on the event loop, never behind queued work in the thread pool.
    @app.get("/health", response_model=Health)
    async def health() -> Health:
        loaded = slot.current
        return Health(status="healthy", backend=loaded.backend_name, documents=loaded.documents,
                      pages=loaded.pages)

    @app.get("/ready")
    async def ready() -> dict:
        """Readiness for load balancers: an index is loaded; the gate's load, for information."""
        loaded = slot.current
        return {"ready": True, "index_version": loaded.version, "in_flight": gate.in_flight,
                "queued": gate.queued, "max_in_flight": gate.limits.max_in_flight,
                "max_queue": gate.limits.max_queue}

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}},
                              "description": "Prometheus text format"}})
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/admin/reload", dependencies=auth,
              responses={401: problems[401], 415: problems[415], 422: problems[422],
                         409: {"model": Problem, "description": "the index cannot be loaded"}})
    def reload_index(req: ReloadRequest | None = None) -> dict:
        """Load a (re)built index and switch to it; requests in flight finish on the old one."""
        previous = slot.current.version
        try:
            loaded = slot.reload(req.index if req is not None else None)
        except (OSError, ValueError) as exc:
            raise HTTPException(status_code=409, detail=f"index not loaded, still serving "
                                                        f"{previous}: {exc}") from exc
        return {"index_version": loaded.version, "previous_version": previous,
                "path": loaded.path, "documents": loaded.documents, "pages": loaded.pages}

    @app.get("/documents", response_model=DocumentList, dependencies=auth,
             responses={401: problems[401]})
    def list_documents() -> DocumentList:
        return DocumentList(documents=[{"doc_id": d, "num_pages": n}
                                       for d, n in slot.current.service.documents.items()])

    async def answer(request: Request, make: Callable[[LoadedIndex, str], bytes]) -> Response:
        # The slot is read once per request, so a live reload never mixes two indexes in one
        # answer; the work runs in ``compute``'s few threads, keeping the event loop free.
        loaded = slot.follow()
        form = MSGPACK if prefers_msgpack(request.headers.get("accept")) else JSON
        return await compute.run(lambda: _answer(loaded, form, lambda: make(loaded, form)))

    @app.post("/batch_search", response_class=Response, dependencies=auth,
              responses={200: {"model": list[list[Item]], "description": "one list per query"},
                         **problems})
    async def batch_search(req: BatchSearchRequest, request: Request) -> Response:
        return await answer(request, lambda index, form: index.service.batch_search(
            req.query, req.id, req.top_n, req.return_score, form))

    @app.post("/search", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "hits, best first"}, **problems})
    async def search(req: SearchRequest, request: Request) -> Response:
        return await answer(request, lambda index, form: index.service.search(
            req.query, req.id, req.top_n, req.return_score, form))

    @app.post("/batch_fetch", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "one item per fetch"},
                         **problems})
    async def batch_fetch(req: BatchFetchRequest, request: Request) -> Response:
        return await answer(request, lambda index, form: index.service.batch_fetch(
            req.query, req.id, form))

    @app.post("/fetch", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "one item"}, **problems})
    async def fetch(req: FetchRequest, request: Request) -> Response:
        # ALDEN's single-page fetch; same items as /batch_fetch.
        return await answer(request, lambda index, form: index.service.batch_fetch(
            [req.query], [req.id], form))

    @app.post("/batch_crop", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "one image per crop"},
                         **problems})
    async def batch_crop(req: BatchCropRequest, request: Request) -> Response:
        """A region of each page, drawn from its PDF at the resolution the band allows (see
        docs/retriever.md, *Crop*)."""
        band = Band(req.min_pixels, req.max_pixels, req.factor)
        return await answer(request, lambda index, form: index.service.batch_crop(
            req.id, req.page, req.box, band, form))

    return app
