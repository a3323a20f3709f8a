"""FastAPI routes speaking the existing retriever wire format (see docs/retriever.md).

Routing, auth and error mapping only; the work is in ``service.RetrieverService``. Request-level
problems (malformed JSON, wrong types, batch too large, top_n out of range) are 422s with a
readable ``detail``; item-level problems are error items inside a normal 200 answer.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from os import PathLike

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader

from .backends import Backend, open_backend
from .backends.bm25 import Bm25Backend
from .cache import DEFAULT_CACHE_BYTES, FragmentCache
from .limits import Limits
from .schemas import (BatchFetchRequest, BatchSearchRequest, DocumentList, FetchRequest, Health,
                      Item, Problem, SearchRequest)
from .service import RequestError, RetrieverService
from .store import PageStore

API_KEY_HEADER = "X-API-Key"
_JSON = "application/json"


def _as_backend(source) -> Backend:
    if isinstance(source, Backend):
        return source
    if isinstance(source, PageStore):
        return Bm25Backend.from_store(source)
    if isinstance(source, (str, PathLike)):
        return open_backend(source)
    raise TypeError(f"create_app needs an index dir, a PageStore or a Backend, got {type(source)}")


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


def _answer(make: Callable[[], bytes]) -> Response:
    try:
        return Response(make(), media_type=_JSON)
    except RequestError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=422)


def create_app(source, *, api_key: str | None = None, limits: Limits | None = None,
               cache_bytes: int = DEFAULT_CACHE_BYTES, preload: bool = False) -> FastAPI:
    """The retriever app over an index dir, a ``PageStore`` or any ``Backend``.

    ``api_key``: require ``X-API-Key`` on every route but /health. ``preload``: read every page
    into the image cache now instead of on first use.
    """
    backend = _as_backend(source)
    cache = FragmentCache(backend, cache_bytes)
    if preload:
        cache.warm()
    service = RetrieverService(backend, cache, limits or Limits())
    auth = [Depends(_api_key_dependency(api_key))]
    problems = {code: {"model": Problem, "description": text} for code, text in [
        (401, "missing or wrong API key"), (413, "request body too large"),
        (422, "malformed request: wrong types, batch too large, top_n out of range")]}
    # strict_content_type=False: a JSON body is read as JSON even without the header (curl -d).
    app = FastAPI(title="vrag-retriever", version="1", strict_content_type=False,
                  description="Page-image retriever: search inside one document, fetch a page. "
                              "Page ids are `<doc_id>_<page>` with 1-based pages.")
    app.state.service = service
    app.add_middleware(_BodyLimit, max_bytes=service.limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()[:5])
        return JSONResponse(status_code=422, content={
            "detail": f"invalid request: {summary} (the request schema is at GET /docs)"})

    @app.get("/health", response_model=Health)
    def health() -> Health:
        docs = service.documents
        return Health(status="healthy", backend=backend.name, documents=len(docs),
                      pages=sum(docs.values()))

    @app.get("/documents", response_model=DocumentList, dependencies=auth,
             responses={401: problems[401]})
    def list_documents() -> DocumentList:
        return DocumentList(documents=[{"doc_id": d, "num_pages": n}
                                       for d, n in service.documents.items()])

    # Sync handlers: FastAPI runs them in its thread pool, keeping the event loop free for I/O.
    @app.post("/batch_search", response_class=Response, dependencies=auth,
              responses={200: {"model": list[list[Item]], "description": "one list per query"},
                         **problems})
    def batch_search(req: BatchSearchRequest) -> Response:
        return _answer(lambda: service.batch_search(req.query, req.id, req.top_n, req.return_score))

    @app.post("/search", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "hits, best first"}, **problems})
    def search(req: SearchRequest) -> Response:
        return _answer(lambda: service.search(req.query, req.id, req.top_n, req.return_score))

    @app.post("/batch_fetch", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "one item per fetch"},
                         **problems})
    def batch_fetch(req: BatchFetchRequest) -> Response:
        return _answer(lambda: service.batch_fetch(req.query, req.id))

    @app.post("/fetch", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "one item"}, **problems})
    def fetch(req: FetchRequest) -> Response:
        # ALDEN's single-page fetch; same items as /batch_fetch.
        return _answer(lambda: service.batch_fetch([req.query], [req.id]))

    return app
