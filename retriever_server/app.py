"""FastAPI routes speaking the existing retriever wire format (see docs/retriever.md).

Request-level problems (malformed JSON, wrong types, batch too large, top_n out of range) are
422s. Item-level problems (unknown doc, page out of range, empty or over-long query, unreadable
fetch spec) become ``{"id": "error", "contents": reason}`` items so the rest of the batch is
answered normally.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from os import PathLike

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader

from . import wire
from .backends import Backend, Hit, open_backend
from .backends.bm25 import Bm25Backend
from .cache import DEFAULT_CACHE_BYTES, FragmentCache
from .limits import (Limits, doc_problem, fetch_spec_problem, page_problem, parse_fetch_spec,
                     query_problem)
from .schemas import (BatchFetchRequest, BatchSearchRequest, DocumentList, Health, Item,
                      Problem, SearchRequest)
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


def _unprocessable(message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=message)


def _doc_ids(ids: list[str] | str, n: int) -> list[str]:
    if isinstance(ids, str):
        return [ids] * n
    if len(ids) != n:
        raise _unprocessable(f"'query' has {n} items but 'id' has {len(ids)}; give one doc id "
                             f"per query (or a single string for all)")
    return ids


class _Body413:
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


def create_app(source, *, api_key: str | None = None, limits: Limits = Limits(),
               cache_bytes: int = DEFAULT_CACHE_BYTES, preload: bool = False) -> FastAPI:
    """The retriever app over an index dir, a ``PageStore`` or any ``Backend``."""
    backend = _as_backend(source)
    cache = FragmentCache(backend, cache_bytes)
    if preload:
        cache.warm()
    documents = backend.documents()
    auth = [Depends(_api_key_dependency(api_key))]
    problems = {code: {"model": Problem, "description": text} for code, text in [
        (401, "missing or wrong API key"), (413, "request body too large"),
        (422, "malformed request: wrong types, batch too large, top_n out of range")]}
    app = FastAPI(title="vrag-retriever", version="1",
                  description="Page-image retriever: search inside one document, fetch a page. "
                              "Page ids are `<doc_id>_<page>` with 1-based pages.")
    app.state.backend, app.state.cache, app.state.limits = backend, cache, limits
    app.add_middleware(_Body413, max_bytes=limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in errors[:5])
        return JSONResponse(status_code=422, content={"detail": f"invalid request: {summary}"})

    def check_batch(n: int) -> None:
        if n > limits.max_batch:
            raise _unprocessable(f"batch of {n} items is over the limit of {limits.max_batch}; "
                                 f"split it")

    def check_top_n(top_n: int) -> None:
        if not 1 <= top_n <= limits.max_top_n:
            raise _unprocessable(f"top_n must be between 1 and {limits.max_top_n}, got {top_n}")

    def search_items(queries: list[str], doc_ids: list[str], top_n: int) -> list[list[Hit] | str]:
        """Hits per item, or the reason string for an item that cannot be searched."""
        out: list[list[Hit] | str] = [""] * len(queries)
        todo = []
        for i, (query, doc_id) in enumerate(zip(queries, doc_ids)):
            problem = doc_problem(doc_id, documents) or query_problem(query, limits)
            if problem:
                out[i] = problem
            else:
                todo.append(i)
        if todo:
            try:
                found = backend.search([queries[i] for i in todo], [doc_ids[i] for i in todo], top_n)
            except Exception:
                # Isolate the failing item instead of failing the whole batch.
                found = []
                for i in todo:
                    try:
                        found.extend(backend.search([queries[i]], [doc_ids[i]], top_n))
                    except Exception as exc:  # noqa: BLE001 - reported to the caller per item
                        found.append(f"search failed: {type(exc).__name__}")
            for i, hits in zip(todo, found):
                out[i] = hits
        return out

    def hits_parts(hits: list[Hit] | str, with_score: bool, parts: list[bytes]) -> None:
        if isinstance(hits, str):
            parts += [b"[", wire.error_item(hits), b"]"]
            return
        parts.append(b"[")
        for j, hit in enumerate(hits):
            if j:
                parts.append(b",")
            parts += wire.hit_parts(cache.get(hit.doc_id, hit.page), hit.score if with_score else None)
        parts.append(b"]")

    @app.get("/health", response_model=Health)
    def health() -> Health:
        return Health(status="healthy", backend=backend.name, documents=len(documents),
                      pages=sum(documents.values()))

    @app.get("/documents", response_model=DocumentList, dependencies=auth,
             responses={401: problems[401]})
    def list_documents() -> DocumentList:
        return DocumentList(documents=[{"doc_id": d, "num_pages": n} for d, n in documents.items()])

    @app.post("/batch_search", response_class=Response, dependencies=auth,
              responses={200: {"model": list[list[Item]], "description": "one list per query"},
                         **problems})
    def batch_search(req: BatchSearchRequest) -> Response:
        check_batch(len(req.query))
        check_top_n(req.top_n)
        doc_ids = _doc_ids(req.id, len(req.query))
        parts = [b"["]
        for i, hits in enumerate(search_items(req.query, doc_ids, req.top_n)):
            if i:
                parts.append(b",")
            hits_parts(hits, req.return_score, parts)
        parts.append(b"]")
        return Response(b"".join(parts), media_type=_JSON)

    @app.post("/search", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "hits, best first"}, **problems})
    def search(req: SearchRequest) -> Response:
        check_top_n(req.top_n)
        parts: list[bytes] = []
        hits_parts(search_items([req.query], [req.id], req.top_n)[0], req.return_score, parts)
        return Response(b"".join(parts), media_type=_JSON)

    def fetch_one(spec: str, doc_id: str) -> list[bytes]:
        parsed = parse_fetch_spec(spec) if len(spec) <= limits.max_query_chars else None
        if parsed is None:
            return [wire.error_item(fetch_spec_problem(spec))]
        modality, page = parsed
        problem = doc_problem(doc_id, documents) or page_problem(doc_id, page, documents)
        if problem:
            return [wire.error_item(problem)]
        spec_id = f"{modality}, {page}"
        try:
            if modality == "text":
                return [wire.item_json(spec_id, backend.page_text(doc_id, page), doc_id=doc_id,
                                       page=page, mime="text/plain")]
            return wire.image_fetch_parts(spec_id, cache.get(doc_id, page))
        except (KeyError, IndexError, OSError) as exc:
            return [wire.error_item(f"page could not be read: {type(exc).__name__}")]

    @app.post("/batch_fetch", response_class=Response, dependencies=auth,
              responses={200: {"model": list[Item], "description": "one item per fetch"},
                         **problems})
    def batch_fetch(req: BatchFetchRequest) -> Response:
        check_batch(len(req.query))
        doc_ids = _doc_ids(req.id, len(req.query))
        parts = [b"["]
        for i, (spec, doc_id) in enumerate(zip(req.query, doc_ids)):
            if i:
                parts.append(b",")
            parts += fetch_one(spec, doc_id)
        parts.append(b"]")
        return Response(b"".join(parts), media_type=_JSON)

    return app
