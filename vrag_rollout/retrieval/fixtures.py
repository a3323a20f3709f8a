"""Record retriever traffic once, replay it offline through the real `RetrieverClient`.

Replay is per item, not per request: a search is keyed by `(doc_id, query, top_n)` (doc_id null
for a search of the whole corpus), a fetch
by `(doc_id, spec)` (spec canonicalised to "image, 3" / "text, 3") and a crop by
`(doc_id, page, box, min_pixels, max_pixels, factor)` (the box as 4 floats), so any batch made
of recorded items replays, in any order and any chunking.

Fixture file format 1 (JSON, UTF-8). It is written with sorted keys, sorted entries and a
1-space indent, so recording the same server twice gives byte-identical files and a re-record
diffs line by line:

    {
     "format": 1,
     "search": [                                   # corpus searches first, then by (doc_id, query, top_n)
      {"doc_id": "annual_report", "query": "revenue 2023", "top_n": 3,
       "results": [{"blob": "<sha256>", "id": "annual_report_3"}, ...]}
     ],
     "fetch": [                                    # sorted by (doc_id, spec)
      {"doc_id": "annual_report", "spec": "image, 3", "result": {"blob": "<sha256>", "id": "image, 3"}},
      {"doc_id": "annual_report", "spec": "text, 3", "result": {"contents": "page text", "id": "text, 3"}}
     ],
     "crop": [                                     # only when crops were recorded; sorted by key
      {"doc_id": "annual_report", "page": 3, "box": [0.1, 0.2, 0.5, 0.4], "min_pixels": 3136,
       "max_pixels": 1003520, "factor": 28, "result": {"blob": "<sha256>", "id": "annual_report_3"}}
     ],
     "blobs": {"<sha256>": "<base64 JPEG>"}
    }

A file without "crop" (all files recorded before crops) reads as having none, and a file
without crops is written without the key, so re-recording such a file stays byte-identical.

Items are the wire items exactly as the server sent them in JSON (extra fields kept; an image
recorded from a MessagePack answer is stored as its base64 text, as JSON carries it), except that image
contents (search hits, image fetches and crops) move to "blobs", keyed by the sha256 of the base64
text: a page image is stored once however often it was retrieved. Text pages and per-item errors
(`{"id": "error", "contents": reason}`, recorded too: they replay as the same error) stay inline.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections import Counter
from typing import Any, Iterable, Sequence

from retriever_server import contract

from .blocking import HttpTransport
from .client import RetrieverClient
from .transport import TransportHTTPError
from .types import FetchSpec, RetrieverFailure
from .wire import ERROR_ID, is_wire_item

FORMAT = 1
SearchKey = tuple[str | None, str, int]  # (doc_id, None: the whole corpus; query, top_n)
FetchKey = tuple[str, str]  # (doc_id, canonical spec)
CropKey = tuple[str, int, tuple[float, ...], int, int, int]  # (doc_id, page, box, min, max, factor)
_KINDS = {3: "search (doc_id, query, top_n)", 2: "fetch (doc_id, spec)",
          6: "crop (doc_id, page, box, min_pixels, max_pixels, factor)"}


def crop_key(doc_id: str, page: int, box, min_pixels: int, max_pixels: int, factor: int) -> CropKey:
    """A crop's key; the box as floats, so [0, 0, 1, 1] and [0.0, 0.0, 1.0, 1.0] are one key."""
    return (doc_id, int(page), tuple(float(v) for v in box), int(min_pixels), int(max_pixels), int(factor))


class FixtureMiss(LookupError):
    """A strict replay was asked for an item that was never recorded (a test bug, not a fault)."""

    def __init__(self, key: tuple, source: str | None = None):
        kind = _KINDS.get(len(key), "item")
        where = f" in {source}" if source else ""
        super().__init__(f"no recorded {kind} {key!r}{where}; record it with record_fixtures()")
        self.key = key


def canonical_spec(spec: str) -> str:
    """The contract's canonical form of a fetch spec; unreadable forms still key consistently."""
    parsed = contract.parse_fetch_spec(spec)
    return contract.fetch_spec(*parsed) if parsed else spec.strip()


def _blob_key(contents: str) -> str:
    return hashlib.sha256(contents.encode("utf-8")).hexdigest()


def _as_json_item(item: dict) -> dict:
    """A copy of a wire item as a JSON answer carries it: an image's bytes (from a MessagePack
    answer) become its base64 text, so a recording does not depend on the answer format."""
    out = dict(item)
    if isinstance(out.get("contents"), (bytes, bytearray)):
        out["contents"] = base64.b64encode(out["contents"]).decode("ascii")
    return out


def _is_image_fetch(spec: str) -> bool:
    return spec.startswith("image")


# --------------------------------------------------------------------------- in-memory store


class Fixtures:
    """Recorded items, keyed per item. Holds wire items with their contents inline."""

    def __init__(self) -> None:
        self.search: dict[SearchKey, list[dict]] = {}
        self.fetch: dict[FetchKey, dict] = {}
        self.crop: dict[CropKey, dict] = {}

    def add_search(self, doc_id: str, query: str, top_n: int, results: list[dict]) -> None:
        self.search[(doc_id, query, int(top_n))] = [_as_json_item(r) for r in results]

    def add_fetch(self, doc_id: str, spec: str, result: dict) -> None:
        self.fetch[(doc_id, canonical_spec(spec))] = _as_json_item(result)

    def add_crop(self, key: CropKey, result: dict) -> None:
        self.crop[crop_key(*key)] = _as_json_item(result)

    # -- serialisation (pure)

    def to_json(self) -> str:
        blobs: dict[str, str] = {}

        def pack(item: dict, image: bool) -> dict:
            if not image or item.get("id") == ERROR_ID:
                return item
            packed = {k: v for k, v in item.items() if k != "contents"}
            packed["blob"] = key = _blob_key(item["contents"])
            blobs[key] = item["contents"]
            return packed

        doc = {
            "format": FORMAT,
            "search": [
                {"doc_id": d, "query": q, "top_n": n, "results": [pack(r, True) for r in self.search[(d, q, n)]]}
                for d, q, n in sorted(self.search, key=_search_order)
            ],
            "fetch": [
                {"doc_id": d, "spec": s, "result": pack(self.fetch[(d, s)], _is_image_fetch(s))}
                for d, s in sorted(self.fetch)
            ],
        }
        if self.crop:
            doc["crop"] = [
                {"doc_id": d, "page": p, "box": list(b), "min_pixels": lo, "max_pixels": hi, "factor": f,
                 "result": pack(self.crop[(d, p, b, lo, hi, f)], True)}
                for d, p, b, lo, hi, f in sorted(self.crop)
            ]
        doc["blobs"] = blobs
        return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Fixtures":
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a retriever fixture file of format {FORMAT}")
        blobs = doc.get("blobs", {})

        def unpack(item: dict) -> dict:
            if "blob" not in item:
                return item
            if item["blob"] not in blobs:
                raise ValueError(f"fixture file references a missing blob {item['blob']}")
            out = {k: v for k, v in item.items() if k != "blob"}
            out["contents"] = blobs[item["blob"]]
            return out

        fx = cls()
        for e in doc.get("search", []):
            fx.add_search(e["doc_id"], e["query"], e["top_n"], [unpack(r) for r in e["results"]])
        for e in doc.get("fetch", []):
            fx.add_fetch(e["doc_id"], e["spec"], unpack(e["result"]))
        for e in doc.get("crop", []):
            key = (e["doc_id"], e["page"], e["box"], e["min_pixels"], e["max_pixels"], e["factor"])
            fx.add_crop(key, unpack(e["result"]))
        return fx

    def save(self, path: str | os.PathLike) -> str:
        text = self.to_json()
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)  # never leave a half-written fixture behind
        return text

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Fixtures":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())


def _search_order(key: SearchKey) -> tuple:
    """Corpus searches (doc_id None, JSON null) first, then by document, query and top_n."""
    doc_id, query, top_n = key
    return doc_id is not None, doc_id or "", query, top_n


def _crop_keys(body: dict) -> list[CropKey]:
    """The key of each crop of a /batch_crop body (as `wire.crop_body` writes it)."""
    ids, pages, boxes = body.get("id"), body.get("page"), body.get("box")
    if isinstance(ids, str) and isinstance(pages, list):
        ids = [ids] * len(pages)
    if not (isinstance(ids, list) and isinstance(pages, list) and isinstance(boxes, list)
            and len(ids) == len(pages) == len(boxes)):
        raise TransportHTTPError(422, "request needs equal-length 'id', 'page' and 'box' lists")
    try:
        return [crop_key(d, p, b, body["min_pixels"], body["max_pixels"], body.get("factor", contract.CROP_FACTOR))
                for d, p, b in zip(ids, pages, boxes)]
    except (KeyError, TypeError, ValueError):
        raise TransportHTTPError(422, "request needs min_pixels, max_pixels and boxes of numbers") from None


def _pairs(body: dict) -> tuple[list, list]:
    queries, ids = body.get("query"), body.get("id")
    if not isinstance(queries, list) or not isinstance(ids, list) or len(queries) != len(ids):
        raise TransportHTTPError(422, "request needs equal-length 'query' and 'id' lists")
    return queries, ids


# --------------------------------------------------------------------------- replay


class FixtureTransport:
    """A transport (see transport.Transport) answering from recorded items."""

    def __init__(self, fixtures: Fixtures, *, strict: bool = True, source: str | None = None):
        self.fixtures = fixtures
        self.strict = strict
        self.source = source
        self.requests: Counter[str] = Counter()  # path -> number of requests, for tests
        self._count_lock = threading.Lock()  # the client's pool calls post() from several threads

    @classmethod
    def load(cls, path: str | os.PathLike, *, strict: bool = True) -> "FixtureTransport":
        return cls(Fixtures.load(path), strict=strict, source=os.fspath(path))

    def post(self, path: str, body: dict, timeout: float) -> Any:
        with self._count_lock:
            self.requests[path] += 1
        if path == "/batch_crop":
            return [self._crop(key) for key in _crop_keys(body)]
        queries, ids = _pairs(body)
        if path == "/batch_search":
            top_n = body.get("top_n")
            return [self._search(d, q, top_n) for q, d in zip(queries, ids)]
        if path == "/batch_fetch":
            return [self._fetch(d, s) for s, d in zip(queries, ids)]
        raise TransportHTTPError(404, f"fixture replay has no route {path}")

    def get(self, path: str, timeout: float) -> Any:
        if path == "/health":
            return {"status": "ok"}
        raise TransportHTTPError(404, f"fixture replay has no route {path}")

    def close(self) -> None:
        pass

    def _search(self, doc_id: str, query: str, top_n: Any) -> list[dict]:
        key = (doc_id, query, top_n)
        hit = self.fixtures.search.get(key)
        return [dict(r) for r in hit] if hit is not None else [self._miss(key)]

    def _fetch(self, doc_id: str, spec: str) -> dict:
        key = (doc_id, canonical_spec(spec))
        hit = self.fixtures.fetch.get(key)
        return dict(hit) if hit is not None else self._miss(key)

    def _crop(self, key: CropKey) -> dict:
        hit = self.fixtures.crop.get(key)
        return dict(hit) if hit is not None else self._miss(key)

    def _miss(self, key: tuple) -> dict:
        if self.strict:
            raise FixtureMiss(key, self.source)
        return {"id": ERROR_ID, "contents": f"no recorded result for {key!r}"}


# --------------------------------------------------------------------------- recording


class RecordingTransport:
    """Wraps a live transport and records every well-formed item it passes through."""

    def __init__(self, inner, fixtures: Fixtures | None = None):
        self.inner = inner
        self.fixtures = fixtures if fixtures is not None else Fixtures()
        self._lock = threading.Lock()  # the client calls post() from several threads

    def post(self, path: str, body: dict, timeout: float) -> Any:
        data = self.inner.post(path, body, timeout)
        if path == "/batch_crop":
            keys = _crop_keys(body)
            if isinstance(data, list) and len(data) == len(keys):
                with self._lock:
                    for key, answer in zip(keys, data):
                        if is_wire_item(answer):
                            self.fixtures.add_crop(key, answer)
        elif isinstance(data, list) and len(data) == len(body.get("query", ())):
            with self._lock:
                self._record(path, body, data)
        return data

    def _record(self, path: str, body: dict, data: list) -> None:
        for query, doc_id, answer in zip(body["query"], body["id"], data):
            if path == "/batch_search" and isinstance(answer, list) and all(is_wire_item(h) for h in answer):
                self.fixtures.add_search(doc_id, query, body["top_n"], answer)
            elif path == "/batch_fetch" and is_wire_item(answer) and (
                    _is_image_fetch(canonical_spec(query)) or isinstance(answer["contents"], str)):
                # (a text page sent as bytes is malformed: the client does not use it either)
                self.fixtures.add_fetch(doc_id, query, answer)

    def get(self, path: str, timeout: float) -> Any:
        return self.inner.get(path, timeout)

    def close(self) -> None:
        self.inner.close()

    def save(self, path: str | os.PathLike) -> str:
        with self._lock:
            return self.fixtures.save(path)


def record_fixtures(
    base_url: str,
    path: str | os.PathLike,
    *,
    searches: Iterable[tuple[str, str]],
    fetches: Iterable[tuple[str, str]],
    top_n: int,
    api_key: str | None = None,
    timeout: float = 30.0,
    max_batch: int = 64,
    crops: Iterable[tuple[str, int, Sequence[float]]] = (),
    crop_band: tuple[int, int] | tuple[int, int, int] = (512 * 28 * 28, 1280 * 28 * 28),
) -> dict:
    """Ask a LIVE retriever for `searches` [(doc_id, query)], `fetches` [(doc_id, "image, 3")]
    and `crops` [(doc_id, page, box)] (in `crop_band`: (min_pixels, max_pixels[, factor]))
    and write the fixture file. Raises RuntimeError (and writes nothing) if any item failed for a
    transport reason: a fixture recorded during an outage would silently miss items. Per-item
    server errors are recorded and counted."""
    searches, fetches, crops = list(searches), list(fetches), list(crops)
    recorder = RecordingTransport(HttpTransport(base_url, api_key=api_key, binary=False))
    with RetrieverClient(base_url, timeout=timeout, max_batch=max_batch, transport=recorder) as client:
        results: list = []
        if searches:
            results += client.batch_search([q for _, q in searches], [d for d, _ in searches], top_n)
        if fetches:
            results += client.batch_fetch([FetchSpec.parse(s) for _, s in fetches], [d for d, _ in fetches])
        if crops:
            lo, hi, *factor = crop_band
            results += client.batch_crop([c[0] for c in crops], [c[1] for c in crops], [c[2] for c in crops],
                                         lo, hi, factor=factor[0] if factor else contract.CROP_FACTOR)
    failures = [r for r in results if isinstance(r, RetrieverFailure)]
    # Error items the server answered (a page past the end, ...) are recordings too; only calls
    # that got no answer (timeouts, refused connections, malformed bodies) spoil the recording.
    broken = [f for f in failures if f.kind not in ("server", "request")]
    if broken:
        raise RuntimeError(f"recording incomplete: {len(broken)} item(s) failed, first: {broken[0].message}")
    text = recorder.save(path)
    return {
        "searches": len(recorder.fixtures.search),
        "fetches": len(recorder.fixtures.fetch),
        "crops": len(recorder.fixtures.crop),
        "blobs": len(json.loads(text)["blobs"]),
        "server_errors": len(failures),
        "bytes": len(text.encode("utf-8")),
    }
