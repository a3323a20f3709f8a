"""Batched client for the page retriever (wire format: ALDEN's `/batch_search`, `/batch_fetch`).

Three layers, so the fault handling is written once:

- pure functions build request bodies and turn a parsed response into, per item, a
  `RetrievedPage` (or a list of them) or a `RetrieverFailure`;
- a *transport* does one logical call, `post(path, body, timeout) -> parsed JSON`, and raises a
  `TransportError` subclass (timeout, connection, http status, malformed body) when it cannot.
  `HttpTransport` (urllib3) is the default; `vrag_rollout.fixtures.FixtureTransport` replays
  recorded traffic through the very same client logic;
- `RetrieverClient` chunks a batch (at most `max_batch` items a request), sends the chunks
  concurrently under a cap of `max_concurrency` requests in flight, validates the answers and
  counts what happened in `stats`.

Network and server faults never escape `batch_search` / `batch_fetch` as an exception or a
`None`: every item of an affected chunk becomes a `RetrieverFailure` whose message can be shown
to the model as an observation. Each try is bounded by `timeout` (connect + read), so one chunk
takes at most about (retries + 1) * timeout + backoff * (2 + 4 + ...) seconds. Programming errors (mismatched list lengths, `top_n < 1`, a bad
`FetchSpec`) raise `ValueError`. Images are NOT decoded here: `contents` stays base64.
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import urllib3
from urllib3.exceptions import HTTPError as _Urllib3Error
from urllib3.exceptions import MaxRetryError, NewConnectionError
from urllib3.exceptions import TimeoutError as _Urllib3Timeout
from urllib3.util import Retry, Timeout

MODALITIES = ("image", "text")
FAILURE_KINDS = ("timeout", "connection", "http", "malformed", "server")
# Transient statuses: worth another try. Other 4xx mean our request is wrong; retrying won't help.
RETRY_STATUSES = frozenset([429, *range(500, 600)])
ERROR_ID = "error"


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class RetrievedPage:
    page_id: str  # search: the wire "id" (e.g. "annual_report_3"); fetch: f"{doc_id}_{page}"
    doc_id: str  # the doc the request asked for
    page: int | None  # 1-based; from a "page" field, else the id's "_<n>" suffix, else None
    modality: str  # "image" | "text"
    contents: str  # base64 JPEG (image) or page text (text); never decoded here
    score: float | None = None


@dataclass(frozen=True)
class RetrieverFailure:
    kind: str  # one of FAILURE_KINDS
    message: str  # short, human and model readable


@dataclass(frozen=True)
class FetchSpec:
    modality: str  # "image" | "text"
    page: int  # 1-based, as the model sees it

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"FetchSpec modality must be one of {MODALITIES}, got {self.modality!r}")
        if isinstance(self.page, bool) or not isinstance(self.page, int) or self.page < 1:
            raise ValueError(f"FetchSpec page must be an int >= 1, got {self.page!r}")

    def wire(self) -> str:
        return f"{self.modality}, {self.page}"

    @classmethod
    def parse(cls, text: str) -> "FetchSpec":
        """Inverse of `wire()`; also takes ALDEN's legacy image form "3-th". ValueError otherwise."""
        m = _SPEC_RE.match(text) if isinstance(text, str) else None
        if m:
            return cls(m.group(1), int(m.group(2)))
        m = _LEGACY_SPEC_RE.match(text) if isinstance(text, str) else None
        if m:
            return cls("image", int(m.group(1)))
        raise ValueError(f"not a fetch spec: {text!r} (expected e.g. 'image, 3' or 'text, 3')")


_SPEC_RE = re.compile(r"^\s*(image|text)\s*,\s*(\d+)\s*$")
_LEGACY_SPEC_RE = re.compile(r"^\s*(\d+)-th\s*$")
_PAGE_SUFFIX_RE = re.compile(r"_(\d+)$")


# --------------------------------------------------------------------------- transport


class TransportError(Exception):
    """A call that produced no usable body. `kind` becomes the RetrieverFailure kind."""

    kind = "connection"

    def __init__(self, message: str, *, tries: int = 1):
        super().__init__(message)
        self.tries = tries


class TransportTimeout(TransportError):
    kind = "timeout"


class TransportConnectionError(TransportError):
    kind = "connection"


class TransportHTTPError(TransportError):
    kind = "http"

    def __init__(self, status: int, message: str, *, tries: int = 1):
        super().__init__(message, tries=tries)
        self.status = status


class TransportMalformed(TransportError):
    kind = "malformed"


class Transport(Protocol):
    def post(self, path: str, body: dict, timeout: float) -> Any: ...

    def get(self, path: str, timeout: float) -> Any: ...

    def close(self) -> None: ...


def _tries(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


class HttpTransport:
    """urllib3 transport. Retries (with exponential backoff) live here, in urllib3's `Retry`:
    timeouts, connection errors, 5xx and 429 are retried; other statuses are not. Replay
    transports have no network faults, so they need no retries."""

    def __init__(
        self,
        base_url: str,
        *,
        retries: int = 2,
        backoff: float = 0.25,
        api_key: str | None = None,
        max_connections: int = 4,
        on_retries: Callable[[int], None] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._retries = retries
        self._on_retries = on_retries
        # urllib3 sleeps 0, 2*backoff, 4*backoff, ... between tries; the small jitter spreads the
        # retries of many rollout workers that failed at the same instant.
        self._retry = Retry(
            total=retries,
            backoff_factor=backoff,
            backoff_jitter=backoff / 2,
            backoff_max=10.0,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=None,  # POSTs here are idempotent lookups: retry them too
            raise_on_status=False,  # hand back the last 5xx so we can report its status
            respect_retry_after_header=False,  # keep the worst-case latency bounded by our own numbers
            redirect=False,
        )
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["X-API-Key"] = api_key
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=max(1, max_connections), block=False)

    def post(self, path: str, body: dict, timeout: float) -> Any:
        data = json.dumps(body).encode("utf-8")
        return _parse_json(self._request("POST", path, data, timeout, self._retry))

    def get(self, path: str, timeout: float) -> Any:
        # A health probe: one try; the caller decides how often to poll.
        resp = self._request("GET", path, None, timeout, Retry(0, redirect=False, raise_on_status=False))
        try:
            return _parse_json(resp)
        except TransportMalformed:
            return None  # a plain-text "ok" is still a healthy server

    def close(self) -> None:
        self._pool.clear()

    def _request(self, method: str, path: str, data: bytes | None, timeout: float, retry: Retry):
        try:
            resp = self._pool.request(
                method,
                self.base_url + path,
                body=data,
                headers=self._headers,
                timeout=Timeout(total=timeout),  # bounds each try, connect + read
                retries=retry,
            )
        except MaxRetryError as e:
            tries = (retry.total or 0) + 1  # MaxRetryError means the whole budget was spent
            self._count_retries(tries - 1)
            raise _classify(e.reason, tries) from e
        except (_Urllib3Error, OSError) as e:  # not retryable per the policy: one try
            raise _classify(e, 1) from e
        used = len(resp.retries.history) if resp.retries is not None else 0
        self._count_retries(used)
        if not 200 <= resp.status < 300:
            raise TransportHTTPError(
                resp.status, f"retriever answered HTTP {resp.status} after {_tries(used + 1)}", tries=used + 1
            )
        return resp

    def _count_retries(self, n: int) -> None:
        if n and self._on_retries is not None:
            self._on_retries(n)


def _classify(reason: BaseException | None, tries: int) -> TransportError:
    # NewConnectionError subclasses ConnectTimeoutError: test it first (refused != slow).
    if isinstance(reason, NewConnectionError):
        return TransportConnectionError(f"retriever unreachable after {_tries(tries)}", tries=tries)
    if isinstance(reason, (_Urllib3Timeout, TimeoutError)):
        return TransportTimeout(f"retriever timed out after {_tries(tries)}", tries=tries)
    return TransportConnectionError(f"retriever connection failed after {_tries(tries)}", tries=tries)


def _parse_json(resp) -> Any:
    try:
        return json.loads(resp.data)
    except (ValueError, UnicodeDecodeError) as e:
        raise TransportMalformed("retriever sent a body that is not JSON") from e


# --------------------------------------------------------------------------- pure wire logic


class MalformedResponse(Exception):
    """A response whose overall shape is wrong: no item of the chunk can be trusted."""


def search_body(queries: Sequence[str], doc_ids: Sequence[str], top_n: int) -> dict:
    return {"query": list(queries), "id": list(doc_ids), "top_n": top_n, "return_score": False}


def fetch_body(specs: Sequence[FetchSpec], doc_ids: Sequence[str]) -> dict:
    return {"query": [s.wire() for s in specs], "id": list(doc_ids)}


def _expect_list(data: Any, n: int) -> list:
    if not isinstance(data, list):
        raise MalformedResponse(f"retriever sent a malformed response (expected a list, got {type(data).__name__})")
    if len(data) != n:
        raise MalformedResponse(f"retriever sent a malformed response ({len(data)} results for {n} requests)")
    return data


def is_wire_item(x: Any) -> bool:
    return isinstance(x, dict) and isinstance(x.get("id"), str) and isinstance(x.get("contents"), str)


def _malformed_item(what: str) -> RetrieverFailure:
    return RetrieverFailure("malformed", f"retriever sent a malformed {what}")


def _page_of(item: dict, page_id: str) -> int | None:
    page = item.get("page")
    if isinstance(page, int) and not isinstance(page, bool):
        return page if page >= 1 else None
    m = _PAGE_SUFFIX_RE.search(page_id)
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def _score_of(item: dict) -> float | None:
    s = item.get("score")
    return float(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else None


def parse_search_results(data: Any, doc_ids: Sequence[str], top_n: int) -> list[list[RetrievedPage] | RetrieverFailure]:
    """One entry per query. A bad list for one query fails that query only; a bad outer shape
    raises MalformedResponse (results can't be matched to queries)."""
    out: list[list[RetrievedPage] | RetrieverFailure] = []
    for doc_id, hits in zip(doc_ids, _expect_list(data, len(doc_ids))):
        if not isinstance(hits, list) or not all(is_wire_item(h) for h in hits):
            out.append(_malformed_item("search result"))
            continue
        err = next((h for h in hits if h["id"] == ERROR_ID), None)
        if err is not None:
            out.append(RetrieverFailure("server", err["contents"]))
            continue
        out.append(
            [
                RetrievedPage(h["id"], doc_id, _page_of(h, h["id"]), "image", h["contents"], _score_of(h))
                for h in hits[:top_n]
            ]
        )
    return out


def parse_fetch_results(data: Any, specs: Sequence[FetchSpec], doc_ids: Sequence[str]) -> list[RetrievedPage | RetrieverFailure]:
    out: list[RetrievedPage | RetrieverFailure] = []
    for spec, doc_id, item in zip(specs, doc_ids, _expect_list(data, len(specs))):
        if not is_wire_item(item):
            out.append(_malformed_item("fetch result"))
        elif item["id"] == ERROR_ID:
            out.append(RetrieverFailure("server", item["contents"]))
        elif _echo_mismatch(item["id"], spec):
            # The server answered a different request: results are likely out of order.
            out.append(RetrieverFailure("malformed", f"retriever answered {item['id']!r} to {spec.wire()!r}"))
        else:
            out.append(RetrievedPage(f"{doc_id}_{spec.page}", doc_id, spec.page, spec.modality, item["contents"], _score_of(item)))
    return out


def _echo_mismatch(echo: str, spec: FetchSpec) -> bool:
    try:
        return FetchSpec.parse(echo) != spec
    except ValueError:
        return False  # an id we can't read is tolerated: the wire only promises "error" or the echo


# --------------------------------------------------------------------------- stats


class ClientStats:
    """Counters for metrics. Thread-safe; `snapshot()` gives flat floats, `reset()` zeroes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.calls = 0  # HTTP requests (chunks), not batch_* invocations
            self.items = 0
            self.retries = 0
            self.failures = {k: 0 for k in FAILURE_KINDS}  # failed items by kind
            self.latency_s = 0.0  # summed over calls, retries and backoff included
            self.latency_max_s = 0.0

    def add_retries(self, n: int) -> None:
        with self._lock:
            self.retries += n

    def record_call(self, items: int, latency: float, results: Sequence[object]) -> None:
        with self._lock:
            self.calls += 1
            self.items += items
            self.latency_s += latency
            self.latency_max_s = max(self.latency_max_s, latency)
            for r in results:
                if isinstance(r, RetrieverFailure):
                    self.failures[r.kind] = self.failures.get(r.kind, 0) + 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            snap = {
                "calls": float(self.calls),
                "items": float(self.items),
                "retries": float(self.retries),
                "failures": float(sum(self.failures.values())),
                "latency_s": self.latency_s,
                "latency_max_s": self.latency_max_s,
                "latency_mean_s": self.latency_s / self.calls if self.calls else 0.0,
            }
            snap.update({f"failures/{k}": float(v) for k, v in self.failures.items()})
            return snap


# --------------------------------------------------------------------------- client


class RetrieverClient:
    """See the module docstring. `retries`, `backoff` and `api_key` configure the default HTTP
    transport; pass `transport=` (e.g. a FixtureTransport) to replace it."""

    def __init__(
        self,
        base_url: str | None,
        *,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.25,
        max_batch: int = 64,
        max_concurrency: int = 4,
        api_key: str | None = None,
        transport: Transport | None = None,
    ):
        if timeout <= 0 or retries < 0 or backoff < 0 or max_batch < 1 or max_concurrency < 1:
            raise ValueError("need timeout > 0, retries >= 0, backoff >= 0, max_batch >= 1, max_concurrency >= 1")
        if transport is None and not base_url:
            raise ValueError("RetrieverClient needs a base_url unless a transport is given")
        self.base_url = base_url
        self.timeout = timeout
        self.max_batch = max_batch
        self.max_concurrency = max_concurrency
        self.stats = ClientStats()
        self.transport: Transport = transport or HttpTransport(
            base_url,
            retries=retries,
            backoff=backoff,
            api_key=api_key,
            max_connections=max_concurrency,
            on_retries=self.stats.add_retries,
        )
        # One pool per client: the cap holds across concurrent batch_* callers too.
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="retriever")

    # -- public API

    def batch_search(self, queries: list[str], doc_ids: list[str], top_n: int) -> list[list[RetrievedPage] | RetrieverFailure]:
        queries, doc_ids = list(queries), list(doc_ids)
        _check_inputs(queries, doc_ids, "queries")
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n must be an int >= 1, got {top_n!r}")

        def chunk(lo: int, hi: int):
            body = search_body(queries[lo:hi], doc_ids[lo:hi], top_n)
            return "/batch_search", body, lambda data: parse_search_results(data, doc_ids[lo:hi], top_n)

        return self._run(len(queries), chunk)

    def batch_fetch(self, specs: list[FetchSpec], doc_ids: list[str]) -> list[RetrievedPage | RetrieverFailure]:
        specs, doc_ids = list(specs), list(doc_ids)
        _check_inputs(specs, doc_ids, "specs")
        if not all(isinstance(s, FetchSpec) for s in specs):
            raise ValueError("specs must be FetchSpec instances")

        def chunk(lo: int, hi: int):
            body = fetch_body(specs[lo:hi], doc_ids[lo:hi])
            return "/batch_fetch", body, lambda data: parse_fetch_results(data, specs[lo:hi], doc_ids[lo:hi])

        return self._run(len(specs), chunk)

    def health(self) -> bool:
        try:
            self.transport.get("/health", self.timeout)
        except TransportError:
            return False
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.transport.close()

    def __enter__(self) -> "RetrieverClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals

    def _run(self, n: int, chunk: Callable[[int, int], tuple]) -> list:
        bounds = [(lo, min(lo + self.max_batch, n)) for lo in range(0, n, self.max_batch)]
        futures = [self._pool.submit(self._call, hi - lo, *chunk(lo, hi)) for lo, hi in bounds]
        out: list = []
        for f in futures:
            out.extend(f.result())  # only programming errors (e.g. FixtureMiss) propagate
        return out

    def _call(self, n: int, path: str, body: dict, parse: Callable[[Any], list]) -> list:
        start = time.monotonic()
        try:
            results = parse(self.transport.post(path, body, self.timeout))
        except TransportError as e:
            results = [RetrieverFailure(e.kind, str(e))] * n
        except MalformedResponse as e:
            results = [RetrieverFailure("malformed", str(e))] * n
        self.stats.record_call(n, time.monotonic() - start, results)
        return results


def _check_inputs(items: list, doc_ids: list, name: str) -> None:
    if len(items) != len(doc_ids):
        raise ValueError(f"{name} and doc_ids differ in length: {len(items)} != {len(doc_ids)}")
    if not all(isinstance(d, str) for d in doc_ids):
        raise ValueError("doc_ids must be strings")
    if name == "queries" and not all(isinstance(q, str) for q in items):
        raise ValueError("queries must be strings")
