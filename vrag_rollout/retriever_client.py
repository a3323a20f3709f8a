"""Batched client for the page retriever (wire format: ALDEN's `/batch_search`, `/batch_fetch`).

Three layers, so the fault handling is written once:

- pure functions build request bodies and turn a parsed response into, per item, a
  `RetrievedPage` (or a list of them) or a `RetrieverFailure`;
- a *transport* does one logical call, `post(path, body, timeout) -> parsed JSON`, and raises a
  `TransportError` subclass (timeout, connection, http status, malformed body) when it cannot.
  The client's default is `retriever_aiohttp.AsyncHttpTransport` (aiohttp, on the client's own
  event loop: `send_async`); `HttpTransport` (urllib3, blocking) has the same retry policy for
  direct use and recording; `vrag_rollout.fixtures.FixtureTransport` replays recorded traffic
  through the very same client logic (blocking transports run in a small thread pool);
- `RetrieverClient` chunks a batch (at most `max_batch` items a request), runs the chunks
  concurrently on its event loop (a daemon thread; `batch_*` block the calling thread until
  the batch is done) under a cap of `max_concurrency` chunks at once, validates the answers and
  counts what happened in `stats`.

Replicas: `base_url` may name several servers (a list, or one comma-separated string). Chunks
go round-robin over them; a replica that fails a chunk (connection, timeout, 5xx after its
retries) is skipped for `down_s` seconds and the chunk moves to the next one.

Overload: a server that refuses with 503/429 *and* `Retry-After` (admission control) is not
retried by the transport. Each replica has an `AdaptiveLimit`, a congestion window clocked by answers:
at most `max_concurrency` requests in flight to it; a refusal halves the window (once per round)
and caps it at the requests still at that server, so the refused chunk waits in the client
until one of them is answered; a refusal that leaves nothing in flight closes the window for the
server's hint: `Retry-After-Ms` when the server sends it (this project's server does), else
`Retry-After` (at least `backoff`), doubling per refusal of the chunk up to 8x, times a random
factor in [1, 1.5) (so refused clients do not return in lockstep). Answers regrow the window.
A refused chunk first moves to another replica that is not refusing. A chunk gets at most
`overload_budget_s` seconds in all (waiting for room counts too: in a window, or for a slot
under `max_concurrency` while other callers' chunks hold them); then every item of it becomes a
`RetrieverFailure("overloaded", ...)`. Refusals are counted in
`stats.overloaded`, apart from failures. Answers are decoded after the window's slot is given
back: the window counts requests the server holds, not the client's own work.

Network and server faults, and whatever garbage a server sends, never escape `batch_search` /
`batch_fetch` as an exception or a `None`: every item of an affected chunk becomes a
`RetrieverFailure` whose message can be shown to the model as an observation. Programming
errors (mismatched list lengths, `top_n < 1`, a bad `FetchSpec`) raise `ValueError`.

Threads and deadlines: `batch_*`, `health` and `close` may be called from any number of threads
at once. Each try is bounded by `timeout` (connect + read); one logical call to one replica by
`call_bound_s` (its tries and the backoff between them; a blocking transport that overstays it
fails as a timeout); a chunk by `overload_budget_s` plus one such call per replica; and so a `batch_*`
call by `deadline_s`: past it (only if the client's event loop is stuck) the caller gets
`TimeoutError`. `close()` (or collection, from any thread, finalizers on the client's own
threads included) ends the calls in flight at once: their callers, and later calls, raise
`RuntimeError("this RetrieverClient is closed")`. A forked child gets a fresh client (its own
loop, pool, connections, windows and zeroed stats; `os.register_at_fork`); a transport passed
in as `transport=` is the caller's to make fork-safe (this module's HTTP transports are).

Answer format: the HTTP transports ask for MessagePack (``Accept: application/msgpack,
application/json;q=0.5``); this project's server then sends each image as its JPEG bytes, a
quarter smaller than base64 and nothing to decode (measured: 0.20 ms of client CPU for an
answer of 8 images that took 0.44 ms as JSON). A server that only speaks JSON (ALDEN's) answers JSON,
read as before. Images are NOT decoded here: an image's `contents` is the JPEG bytes (a
MessagePack answer) or base64 text (a JSON answer, fixtures); text pages are always `str`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence, Union

import urllib3
from urllib3.exceptions import HTTPError as _Urllib3Error
from urllib3.exceptions import InvalidHeader, MaxRetryError, NewConnectionError
from urllib3.exceptions import TimeoutError as _Urllib3Timeout
from urllib3.util import Retry, Timeout

from retriever_server import contract

try:
    # An answer is ~1 MB of JSON, mostly base64 strings: msgspec decodes it about 6x faster
    # than the standard library (measured 0.2 ms vs 1.2 ms), and reads MessagePack.
    import msgspec

    _loads: Callable[[bytes], Any] = msgspec.json.Decoder().decode
    _unpack: Optional[Callable[[bytes], Any]] = msgspec.msgpack.Decoder().decode
except ImportError:  # same values, slower; JSON answers only
    _loads, _unpack = json.loads, None

MODALITIES = ("image", "text")
# "request": the retriever refused the request as the asker's mistake (contract.REQUEST_CODES,
# e.g. a page the document does not have): for the agent, the policy's mistake, not a fault.
FAILURE_KINDS = ("timeout", "connection", "http", "malformed", "server", "overloaded", "request")
# Transient statuses: worth another try. Other 4xx mean our request is wrong; retrying won't help.
RETRY_STATUSES = frozenset([429, *range(500, 600)])
# With a Retry-After header these are refusals by admission control, not faults.
REFUSAL_STATUSES = frozenset([429, 503])
ERROR_ID = contract.ERROR_ID
BACKOFF_MAX_S = 10.0  # the longest wait between two tries of a call
CLOSED = "this RetrieverClient is closed"
# A call's deadline allows this much beyond what the transports' own timeouts add up to: the
# client's own work (scheduling, decoding); those timeouts fire first unless something is stuck.
SLACK_S = 1.0

# Objects holding what a forked child must not use (the parent's threads, sockets, locks):
# `_after_fork_in_child()` is called on each of them in the child.
_FORK_AWARE: "weakref.WeakSet[Any]" = weakref.WeakSet()
# What they held, kept for good in the child: closing (or collecting) it there would close
# sockets and selectors that the parent still uses.
_INHERITED: list = []


def _after_fork_in_child() -> None:
    for obj in list(_FORK_AWARE):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class RetrievedPage:
    page_id: str  # search: the wire "id" (e.g. "annual_report_3"); fetch: f"{doc_id}_{page}"
    doc_id: str  # the doc the request asked for
    page: int | None  # 1-based; from a "page" field, else the id's "_<n>" suffix, else None
    modality: str  # "image" | "text"
    # image: the JPEG bytes (MessagePack answer) or base64 text (JSON answer, fixtures);
    # text: the page text (always str). Never decoded here.
    contents: Union[str, bytes]
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
        return contract.fetch_spec(self.modality, self.page)

    @classmethod
    def parse(cls, text: str) -> "FetchSpec":
        """Inverse of `wire()` (the contract's grammar, ALDEN's "3-th" included). ValueError otherwise."""
        parsed = contract.parse_fetch_spec(text)
        if parsed is None:
            raise ValueError(f"not a fetch spec: {text!r} (expected e.g. 'image, 3' or 'text, 3')")
        return cls(*parsed)


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


class TransportOverloaded(TransportError):
    """The server refused the call for now (503/429 with Retry-After): admission control."""

    kind = "overloaded"

    def __init__(self, status: int, retry_after: Optional[float], message: str,
                 retry_after_ms: Optional[float] = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # seconds; None when the header was unreadable
        # Retry-After-Ms (sent by this project's server, and by some public APIs), in seconds:
        # the same prediction, not rounded to whole seconds. None when absent or unreadable.
        self.retry_after_ms = retry_after_ms


class _RefusalAwareRetry(Retry):
    """urllib3's Retry, except that an explicit refusal (a Retry-After status carrying the
    header) goes back to the client at once: it may wait, or go to another replica."""

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if has_retry_after and status_code in REFUSAL_STATUSES:
            return False
        return super().is_retry(method, status_code, has_retry_after)

    def increment(self, *args: Any, **kwargs: Any) -> "Retry":
        try:
            return super().increment(*args, **kwargs)
        except MaxRetryError as e:
            # The tries made: the retries so far and this one. The budget may be far from spent
            # (a fail-fast connect gives up after one try whatever `total` says).
            e.tries = len(self.history) + 1  # type: ignore[attr-defined]
            raise


class RawAnswer(NamedTuple):
    """An answer's body and its ``Content-Type`` (None when absent), not yet decoded."""

    data: bytes
    content_type: Optional[str] = None


class Transport(Protocol):
    """A transport may also offer ``send(path, body, timeout) -> RawAnswer`` (the undecoded
    answer, read by ``decode_answer``), as ``HttpTransport`` does: the client then decodes
    outside the window's slot. One offering ``async send_async(...) -> RawAnswer`` (and
    ``get_async``, ``aclose``), as ``AsyncHttpTransport`` does, runs on the client's loop."""

    def post(self, path: str, body: dict, timeout: float) -> Any: ...

    def get(self, path: str, timeout: float) -> Any: ...

    def close(self) -> None: ...


def tries_text(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


def call_bound_s(timeout: float, retries: int, backoff: float) -> float:
    """The longest one logical call takes (the HTTP transports' policy): ``retries + 1`` tries
    of at most ``timeout`` each, and the waits between them (see `HttpSettings`)."""
    waits = sum(min(BACKOFF_MAX_S, backoff * (2 ** k + 0.5)) for k in range(1, retries))
    return (retries + 1) * timeout + waits


def accept_header(binary: bool) -> str:
    """What to ask for: MessagePack first when ``binary`` (and msgspec can read it), else JSON."""
    if binary and _unpack is not None:
        return f"{contract.MSGPACK}, {contract.JSON};q=0.5"
    return contract.JSON


_RETRY_AFTER = Retry(0)


def parse_retry_after(value: str) -> Optional[float]:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds; None when unreadable."""
    try:
        return _RETRY_AFTER.parse_retry_after(value)
    except InvalidHeader:
        return None


class HttpSettings:
    """What both HTTP transports (`HttpTransport`, `retriever_aiohttp.AsyncHttpTransport`) take:
    ``retries`` after the first try, ``backoff`` (seconds, doubled per retry), ``api_key`` (the
    ``X-API-Key`` header), ``max_connections`` kept open, ``on_retries(n)`` (told how many
    retries a call used), ``fail_fast_on_connect`` (a refused connection is not retried: with
    replicas the chunk goes to the next one) and ``binary`` (ask for MessagePack answers, images
    as bytes, where the server has them; False: JSON only, e.g. to record fixtures exactly as
    JSON clients see them)."""

    def __init__(
        self,
        base_url: str,
        *,
        retries: int = 2,
        backoff: float = 0.25,
        api_key: str | None = None,
        max_connections: int = 4,
        on_retries: Callable[[int], None] | None = None,
        fail_fast_on_connect: bool = False,
        binary: bool = True,
    ):
        self.base_url = base_url.rstrip("/")
        self._retries, self._backoff = retries, backoff
        self._max_connections = max(1, max_connections)
        self._on_retries = on_retries
        self._fail_fast_on_connect = fail_fast_on_connect
        self._headers = {"Content-Type": contract.JSON, "Accept": accept_header(binary)}
        if api_key:
            self._headers["X-API-Key"] = api_key

    def _count_retries(self, n: int) -> None:
        if n and self._on_retries is not None:
            self._on_retries(n)


class HttpTransport(HttpSettings):
    """urllib3 transport. Retries (with exponential backoff) live here, in urllib3's `Retry`:
    timeouts, connection errors, 5xx and 429 are retried; other statuses are not. Replay
    transports have no network faults, so they need no retries. Settings: `HttpSettings`."""

    def __init__(self, base_url: str, **settings: Any):
        super().__init__(base_url, **settings)
        retries, backoff = self._retries, self._backoff
        # urllib3 sleeps 0, 2*backoff, 4*backoff, ... between tries; the small jitter spreads the
        # retries of many rollout workers that failed at the same instant.
        self._retry = _RefusalAwareRetry(
            total=retries,
            # With replicas, a refused connection goes straight to another replica.
            connect=0 if self._fail_fast_on_connect else None,
            backoff_factor=backoff,
            backoff_jitter=backoff / 2,
            backoff_max=BACKOFF_MAX_S,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=None,  # POSTs here are idempotent lookups: retry them too
            raise_on_status=False,  # hand back the last 5xx so we can report its status
            respect_retry_after_header=False,  # keep the worst-case latency bounded by our own numbers
            redirect=False,
        )
        self._pool = self._new_pool()
        _FORK_AWARE.add(self)

    def _new_pool(self) -> urllib3.PoolManager:
        return urllib3.PoolManager(num_pools=4, maxsize=self._max_connections, block=False)

    def _after_fork_in_child(self) -> None:
        # The pooled connections are the parent's sockets: two processes on one would read
        # each other's answers.
        _INHERITED.append(self._pool)
        self._pool = self._new_pool()

    def post(self, path: str, body: dict, timeout: float) -> Any:
        return decode_answer(self.send(path, body, timeout))

    def send(self, path: str, body: dict, timeout: float) -> RawAnswer:
        """The call without decoding (``decode_answer`` reads it)."""
        data = json.dumps(body).encode("utf-8")
        resp = self._request("POST", path, data, timeout, self._retry)
        return RawAnswer(resp.data, resp.headers.get("Content-Type"))

    def get(self, path: str, timeout: float) -> Any:
        # A health probe: one try; the caller decides how often to poll.
        resp = self._request("GET", path, None, timeout,
                             _RefusalAwareRetry(0, redirect=False, raise_on_status=False))
        try:
            return decode_json(resp.data)
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
            tries = getattr(e, "tries", 1)  # set by _RefusalAwareRetry
            self._count_retries(tries - 1)
            raise _classify(e.reason, tries) from e
        except (_Urllib3Error, OSError) as e:  # not retryable per the policy: one try
            raise _classify(e, 1) from e
        used = len(resp.retries.history) if resp.retries is not None else 0
        self._count_retries(used)
        if resp.status in REFUSAL_STATUSES and resp.headers.get("Retry-After"):
            wait = parse_retry_after(resp.headers["Retry-After"])
            raise TransportOverloaded(resp.status, wait, f"retriever overloaded (HTTP {resp.status})",
                                      retry_after_ms(resp.headers.get(contract.RETRY_AFTER_MS)))
        if not 200 <= resp.status < 300:
            raise TransportHTTPError(
                resp.status, f"retriever answered HTTP {resp.status} after {tries_text(used + 1)}", tries=used + 1
            )
        return resp

def retry_after_ms(value: Optional[str]) -> Optional[float]:
    """The ``Retry-After-Ms`` header in seconds; None when absent or not a number >= 0."""
    try:
        ms = float(value) if value is not None else None
    except ValueError:
        return None
    return ms / 1000 if ms is not None and 0 <= ms < float("inf") else None


def _classify(reason: BaseException | None, tries: int) -> TransportError:
    # NewConnectionError subclasses ConnectTimeoutError: test it first (refused != slow).
    if isinstance(reason, NewConnectionError):
        return TransportConnectionError(f"retriever unreachable after {tries_text(tries)}", tries=tries)
    if isinstance(reason, (_Urllib3Timeout, TimeoutError)):
        return TransportTimeout(f"retriever timed out after {tries_text(tries)}", tries=tries)
    return TransportConnectionError(f"retriever connection failed after {tries_text(tries)}", tries=tries)


def decode_json(data: bytes) -> Any:
    """An answer's body as JSON values; TransportMalformed when it is not JSON."""
    try:
        return _loads(data)
    # msgspec.DecodeError is a ValueError; both decoders raise RecursionError past their depth limit
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise TransportMalformed("retriever sent a body that is not JSON") from e


def decode_answer(answer: Union[RawAnswer, bytes]) -> Any:
    """An answer's values, read as its ``Content-Type`` says (MessagePack or, by default, JSON;
    plain bytes, as transports written before `RawAnswer` send them, are JSON);
    TransportMalformed when the body is not what it claims."""
    if not isinstance(answer, RawAnswer):
        return decode_json(answer)
    if not contract.is_msgpack(answer.content_type):
        return decode_json(answer.data)
    if _unpack is None:
        raise TransportMalformed("retriever sent MessagePack, which needs msgspec installed")
    try:
        return _unpack(answer.data)
    except (ValueError, RecursionError) as e:  # msgspec.DecodeError is a ValueError
        raise TransportMalformed("retriever sent a body that is not MessagePack") from e


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
    """An item: a str id and contents that are text, or an image's bytes (MessagePack answers);
    an error item's contents (its reason) must be text."""
    if not isinstance(x, dict) or not isinstance(x.get("id"), str):
        return False
    contents = x.get("contents")
    return isinstance(contents, str) or (isinstance(contents, bytes) and x["id"] != ERROR_ID)


def _malformed_item(what: str) -> RetrieverFailure:
    return RetrieverFailure("malformed", f"retriever sent a malformed {what}")


def _page_of(item: dict, page_id: str) -> int | None:
    page = item.get("page")
    if isinstance(page, int) and not isinstance(page, bool):
        return page if page >= 1 else None
    parsed = contract.parse_page_id(page_id)
    return parsed[1] if parsed and parsed[1] >= 1 else None


def _item_failure(item: dict) -> RetrieverFailure:
    """An error item: the asker's mistake when its code says so, else a server fault."""
    code = item.get("code")  # a string when sent; anything else is a server fault too
    kind = "request" if isinstance(code, str) and code in contract.REQUEST_CODES else "server"
    return RetrieverFailure(kind, item["contents"])


def _score_of(item: dict) -> float | None:
    s = item.get("score")
    if not isinstance(s, (int, float)) or isinstance(s, bool):
        return None
    try:
        return float(s)
    except OverflowError:  # an int no float holds (the standard library's JSON reads any)
        return None


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
            out.append(_item_failure(err))
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
            out.append(_item_failure(item))
        elif spec.modality == "text" and not isinstance(item["contents"], str):
            out.append(_malformed_item("text page (bytes, not text)"))
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
        _FORK_AWARE.add(self)

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the lock at the fork; the counts are the parent's.
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.calls = 0  # HTTP requests (chunks), not batch_* invocations
            self.items = 0
            self.retries = 0
            self.overloaded = 0  # refusals (503/429 + Retry-After) received; each was retried
            self.overload_wait_s = 0.0  # time refused chunks waited (an answer, or the hint)
            self.failovers = 0  # chunks moved to another replica after a failure
            self.failures = {k: 0 for k in FAILURE_KINDS}  # failed items by kind
            self.latency_s = 0.0  # summed over calls, retries and backoff included
            self.latency_max_s = 0.0

    def add_retries(self, n: int) -> None:
        with self._lock:
            self.retries += n

    def add_overloaded(self, n: int = 1) -> None:
        with self._lock:
            self.overloaded += n

    def add_overloaded_wait(self, wait_s: float) -> None:
        with self._lock:
            self.overload_wait_s += wait_s

    def add_failover(self) -> None:
        with self._lock:
            self.failovers += 1

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
                "overloaded": float(self.overloaded),
                "overload_wait_s": self.overload_wait_s,
                "failovers": float(self.failovers),
                "failures": float(sum(self.failures.values())),
                "latency_s": self.latency_s,
                "latency_max_s": self.latency_max_s,
                "latency_mean_s": self.latency_s / self.calls if self.calls else 0.0,
            }
            snap.update({f"failures/{k}": float(v) for k, v in self.failures.items()})
            return snap


# --------------------------------------------------------------------------- replicas


def parse_urls(base_url: Union[str, Sequence[str], None]) -> list[str]:
    """`"http://a:8002"`, `"http://a:8002, http://b:8002"` or a list of such -> list of URLs."""
    if base_url is None:
        return []
    parts = base_url.split(",") if isinstance(base_url, str) else [str(u) for u in base_url]
    return [p.strip() for p in parts if p.strip()]


class ReplicaSet:
    """Which replica a chunk tries next: round-robin, with replicas marked down (failed, or
    refusing until their Retry-After) tried last. Thread-safe; `clock` is injectable for tests."""

    def __init__(self, n: int, clock: Callable[[], float] = time.monotonic):
        self._n = n
        self._clock = clock
        self._down_until = [0.0] * n
        self._next = 0
        self._lock = threading.Lock()

    def order(self) -> list[int]:
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % self._n
            now = self._clock()
            rotated = [(start + k) % self._n for k in range(self._n)]
            return sorted(rotated, key=lambda i: self._down_until[i] > now)  # stable: up first

    def mark_down(self, i: int, seconds: float) -> None:
        with self._lock:
            self._down_until[i] = self._clock() + seconds

    def mark_up(self, i: int) -> None:
        with self._lock:
            self._down_until[i] = 0.0


class AdaptiveLimit:
    """How many requests this client keeps in flight to one replica: a congestion window, as
    TCP's (slow start, additive increase, multiplicative decrease), clocked by answers.

    - The window starts at ``maximum``.
    - A refusal cuts it in half, at most once per round (refusals of requests sent before the
      last cut carry no news), and never leaves it above the requests this client still has at
      that server: the server is full now, and each of those answers frees a place there, so
      each answer lets one waiting request go (self-clocking, no sleeping on a guess).
    - A refusal that leaves nothing in flight has no answer to wait for: nothing is sent for
      ``pause_s`` (the server's hint).
    - Answers grow the window by one each while it is below the half the last cut kept (slow
      start: back quickly to what the server took), then by ``1 / window`` each (about one more
      request per round of answers). Never below 1 nor above ``maximum``.

    Requests over the window wait here, in the client, instead of being refused by a busy
    server again and again (each refusal costs both sides CPU, and a client that sleeps on a
    refusal while the server drains leaves it idle). Use it on one event loop (the client's)."""

    def __init__(self, maximum: int):
        self.maximum = maximum
        self.limit = float(maximum)
        self.threshold = float(maximum)  # slow start below it
        self.in_flight = 0
        self._round = 0
        self._paused_until = 0.0
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self, deadline: float) -> Optional[int]:
        """Wait (until the monotonic ``deadline``) for room and for any pause to end; the round
        to pass to `release`, or None when the deadline comes first (at once when a pause
        outlasts it: that wait is not slept)."""
        while True:
            now = time.monotonic()
            if self._paused_until > deadline:
                return None
            wait = max(self._paused_until - now, 0.0) if self.in_flight < int(self.limit) else None
            if wait == 0.0:
                break
            if now >= deadline:
                return None
            woken = asyncio.get_running_loop().create_future()
            self._waiters.append(woken)
            try:  # an answer's release wakes it; else the pause's end or the deadline
                await asyncio.wait([woken], timeout=deadline - now if wait is None else min(wait, deadline - now))
            finally:
                if not woken.done():
                    self._waiters.remove(woken)
        self.in_flight += 1
        return self._round

    def release(self, round_: int, outcome: str, pause_s: float = 0.0) -> None:
        """``outcome``: "ok" (an answer), "refused" (503/429 + Retry-After) or "failed" (a
        fault: no news about load). ``pause_s``: how long the server asked a refused client to
        wait; kept only when no request of this client is left at the server."""
        self.in_flight -= 1
        if outcome == "refused":
            if round_ == self._round:
                self.limit = self.threshold = max(1.0, self.limit / 2)
                self._round += 1
            self.limit = max(1.0, min(self.limit, float(self.in_flight)))
            if self.in_flight == 0:
                self._paused_until = max(self._paused_until, time.monotonic() + pause_s)
        elif outcome == "ok":
            grow = 1.0 if self.limit < self.threshold else 1 / self.limit
            self.limit = min(float(self.maximum), self.limit + grow)
        room = int(self.limit) - self.in_flight
        while room > 0 and self._waiters:
            self._waiters.popleft().set_result(None)
            room -= 1


# --------------------------------------------------------------------------- client


class RetrieverClient:
    """See the module docstring. `base_url` is one URL, several (list or comma-separated), or
    None with `transport=`. `retries`, `backoff`, `api_key` and `binary` (ask for MessagePack
    answers; False: JSON only) configure the default HTTP transports; pass `transport=` (e.g. a
    FixtureTransport) to replace them. `deadline_s`: the longest one `batch_*` call takes, in
    seconds (see "Threads and deadlines" in the module docstring)."""

    _MAX_OVERLOAD_WAIT_S = 10.0
    _MIN_OVERLOAD_WAIT_S = 0.002  # a hint of "0 ms" must not become a busy loop

    def __init__(
        self,
        base_url: Union[str, Sequence[str], None],
        *,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.25,
        max_batch: int = 64,
        max_concurrency: int = 4,
        api_key: str | None = None,
        transport: Transport | None = None,
        overload_budget_s: float = 30.0,
        down_s: float = 5.0,
        binary: bool = True,
    ):
        if timeout <= 0 or retries < 0 or backoff < 0 or max_batch < 1 or max_concurrency < 1:
            raise ValueError("need timeout > 0, retries >= 0, backoff >= 0, max_batch >= 1, max_concurrency >= 1")
        if overload_budget_s < 0 or down_s < 0:
            raise ValueError("need overload_budget_s >= 0 and down_s >= 0")
        urls = parse_urls(base_url)
        if transport is None and not urls:
            raise ValueError("RetrieverClient needs a base_url unless a transport is given")
        self.base_url = base_url
        self.urls = urls
        self.timeout = timeout
        self.backoff = backoff
        self.max_batch = max_batch
        self.max_concurrency = max_concurrency
        self.overload_budget_s = overload_budget_s
        self.down_s = down_s
        self.stats = ClientStats()
        from .retriever_aiohttp import AsyncHttpTransport

        if transport is not None:
            self.transports: list[Any] = [transport]
        else:
            self.transports = [
                AsyncHttpTransport(
                    url,
                    retries=retries,
                    backoff=backoff,
                    api_key=api_key,
                    max_connections=max_concurrency,
                    on_retries=self.stats.add_retries,
                    fail_fast_on_connect=len(urls) > 1,
                    binary=binary,
                )
                for url in urls
            ]
        self.transport = self.transports[0]  # the first (or only) replica
        # Deadlines, from the client's own numbers: one logical call to one replica (its tries
        # and backoff), and one batch_* (the overload budget, then a call to every replica).
        self._send_s = call_bound_s(timeout, retries, backoff) + SLACK_S
        self.deadline_s = overload_budget_s + len(self.transports) * self._send_s + SLACK_S
        self._start()
        _FORK_AWARE.add(self)

    def _start(self) -> None:
        """This process's machinery: the loop and its state, the pool, the finalizer."""
        from .retriever_aiohttp import LoopThread

        self._replicas = ReplicaSet(len(self.transports))
        self._limits = [AdaptiveLimit(self.max_concurrency) for _ in self.transports]
        self._rng = random.Random()
        # Every chunk runs on this client's own event loop; a transport without `send_async`
        # (fixtures, a custom one) is called from a small pool of threads.
        self._loop = LoopThread()
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="retriever")
        self._chunks = asyncio.Semaphore(self.max_concurrency)  # the cap holds across callers too
        # A client nobody closes (a rollout worker's) still closes its connections and its loop
        # when collected or at exit.
        self._closer = weakref.finalize(self, _shut_down, self._loop, self.transports, self._pool)

    def _after_fork_in_child(self) -> None:
        # The parent's loop and pool threads do not exist here and its windows count its
        # requests: a client still open starts afresh (transports and stats see to themselves).
        inherited = self._closer.detach()  # the parent's shutdown must not run here
        if inherited is not None:
            _INHERITED.append(inherited[2])  # (loop, transports, pool), not the client itself
            self._start()

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
        """True when at least one replica answers /health (one try each)."""
        return self._loop.run(self._health(), len(self.transports) * (self.timeout + SLACK_S) + SLACK_S)

    def close(self) -> None:
        """Calls in flight raise RuntimeError at once, as later calls do. From any thread."""
        self._closer()  # once: later calls do nothing

    def __enter__(self) -> "RetrieverClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals

    async def _health(self) -> bool:
        for transport in self.transports:
            try:
                if hasattr(transport, "get_async"):
                    probe = transport.get_async("/health", self.timeout)
                else:
                    probe = asyncio.get_running_loop().run_in_executor(
                        self._pool, transport.get, "/health", self.timeout)
                await asyncio.wait_for(probe, self.timeout + SLACK_S)
            except (TransportError, asyncio.TimeoutError):
                continue
            return True
        return False

    def _run(self, n: int, chunk: Callable[[int, int], tuple]) -> list:
        bounds = [(lo, min(lo + self.max_batch, n)) for lo in range(0, n, self.max_batch)]
        calls = [(hi - lo, *chunk(lo, hi)) for lo, hi in bounds]
        return self._loop.run(self._run_async(calls), self.deadline_s)

    async def _run_async(self, calls: list[tuple]) -> list:
        out: list = []
        # Only programming errors (e.g. FixtureMiss) propagate, the first one raised.
        for results in await asyncio.gather(*(self._call(*call) for call in calls)):
            out.extend(results)
        return out

    async def _call(self, n: int, path: str, body: dict, parse: Callable[[Any], list]) -> list:
        # The overload budget counts from here: a chunk waiting for a slot under the cap (the
        # other callers' chunks hold them) is waiting for room too.
        start = time.monotonic()
        deadline = start + self.overload_budget_s
        try:
            if not await _acquire_by(self._chunks, deadline):
                raise _out_of_budget(None, 0, self.overload_budget_s)
            start = time.monotonic()  # latency: from the slot on
            try:
                results = parse(await self._post(path, body, deadline))
            finally:
                self._chunks.release()
        except TransportError as e:
            results = [RetrieverFailure(e.kind, str(e))] * n
        except MalformedResponse as e:
            results = [RetrieverFailure("malformed", str(e))] * n
        self.stats.record_call(n, time.monotonic() - start, results)
        return results

    async def _send(self, transport: Any, path: str, body: dict) -> Any:
        """The answer: a `RawAnswer` (or bytes) to decode, from `send_async` or `send`; else
        the parsed values from a plain transport's `post`. A blocking transport that overstays
        the client's bound for one call (one that ignores its timeout) fails as a timeout; one on
        the loop bounds its own calls (aiohttp's per-try timeouts; else the caller's deadline)."""
        if hasattr(transport, "send_async"):
            return await transport.send_async(path, body, self.timeout)
        call = getattr(transport, "send", None) or transport.post
        answer = asyncio.get_running_loop().run_in_executor(self._pool, call, path, body, self.timeout)
        try:
            return await asyncio.wait_for(answer, self._send_s)
        except asyncio.TimeoutError:
            raise TransportTimeout(f"retriever gave no answer within {self._send_s:g} s") from None

    async def _post(self, path: str, body: dict, deadline: float) -> Any:
        """One chunk: over the replicas until one answers; raises the last TransportError."""
        failed: set[int] = set()  # replicas that failed this chunk (not counting refusals)
        refusals = 0  # of this chunk, by any replica
        refused_at: Optional[float] = None  # when the chunk started waiting out a refusal
        last_refusal: Optional[TransportOverloaded] = None
        sent: set[int] = set()  # replicas this chunk went to
        while True:
            for i in self._replicas.order():
                # Past the budget a chunk goes only where it has not been yet: refusals with
                # room in the windows cannot bounce it between replicas for ever, and it ends
                # within the budget plus one call per replica.
                if i in failed or (i in sent and time.monotonic() >= deadline):
                    continue
                round_ = await self._limits[i].acquire(deadline)
                if refused_at is not None:
                    self.stats.add_overloaded_wait(time.monotonic() - refused_at)
                    refused_at = None
                if round_ is None:  # the overload budget ran out (or cannot cover a pause)
                    raise _out_of_budget(last_refusal, refusals, self.overload_budget_s)
                outcome, pause = "failed", 0.0
                transport = self.transports[i]
                # An HTTP transport hands back the undecoded answer: it is decoded after the
                # window's slot is given back, since the window counts requests the server
                # holds, not this client's own work.
                undecoded = hasattr(transport, "send_async") or hasattr(transport, "send")
                sent.add(i)
                try:
                    data = await self._send(transport, path, body)
                    outcome = "ok"
                except TransportOverloaded as e:
                    # Busy, not broken: another replica may take the chunk now; others' chunks
                    # try this one last until its Retry-After has passed. This chunk waits in
                    # the window, for an answer or (with none pending) the server's hint,
                    # doubling per refusal of this chunk.
                    refusals += 1
                    last_refusal = e
                    outcome = "refused"
                    pause = self._overload_wait(e.retry_after, refusals, e.retry_after_ms)
                    self.stats.add_overloaded()
                    self._replicas.mark_down(i, e.retry_after or 0.0)
                    refused_at = time.monotonic()
                    continue
                except TransportError:
                    self._fail_over(i, failed)
                    continue
                finally:
                    self._limits[i].release(round_, outcome, pause)
                if undecoded:
                    try:
                        data = decode_answer(data)
                    except TransportMalformed:
                        self._fail_over(i, failed)
                        continue
                self._replicas.mark_up(i)
                return data
            if time.monotonic() >= deadline:  # each replica left has refused it: give up
                raise _out_of_budget(last_refusal, refusals, self.overload_budget_s)

    def _fail_over(self, i: int, failed: set[int]) -> None:
        """Replica ``i`` failed this chunk: it goes last for ``down_s``; re-raises the error
        when no replica is left (call from an ``except`` block)."""
        failed.add(i)
        self._replicas.mark_down(i, self.down_s)
        if len(failed) == len(self.transports):
            raise
        self.stats.add_failover()

    def _overload_wait(self, retry_after: Optional[float], refusals: int,
                       retry_after_ms: Optional[float] = None) -> float:
        # With the server's finer hint (Retry-After-Ms, in seconds here): that, doubling per
        # refusal of this chunk up to 8x; the server predicts its backlog drains in a few ms, and
        # waiting a whole backoff would leave it idle. Without: never earlier than Retry-After
        # (often 0), nor than `backoff`, doubling the same way. The random factor spreads the
        # clients that were refused together so they do not come back in one wave.
        doubling = 2 ** min(refusals - 1, 3)
        if retry_after_ms is not None:
            base = max(retry_after_ms, self._MIN_OVERLOAD_WAIT_S) * doubling
        else:
            base = max(retry_after or 0.0, max(self.backoff, 0.01) * doubling)
        return min(self._MAX_OVERLOAD_WAIT_S, base * self._rng.uniform(1.0, 1.5))


def _shut_down(loop: Any, transports: list, pool: ThreadPoolExecutor) -> None:
    """Close a client, from any thread: a finalizer may run on the loop's own thread or on a
    thread of the pool, so nothing here waits for either."""

    async def close_transports() -> None:
        for transport in transports:
            if hasattr(transport, "aclose"):
                await transport.aclose()

    loop.close(close_transports)
    # A blocking call in flight ends by its own timeout; its caller has already been answered.
    pool.shutdown(wait=False, cancel_futures=True)
    for transport in transports:
        if hasattr(transport, "close"):
            transport.close()


async def _acquire_by(semaphore: asyncio.Semaphore, deadline: float) -> bool:
    """``semaphore.acquire()``, giving up (False) at the monotonic ``deadline``."""
    if not semaphore.locked():
        return await semaphore.acquire()  # at once, even with no time left
    try:
        return await asyncio.wait_for(semaphore.acquire(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        return False


def _out_of_budget(refusal: Optional[TransportOverloaded], refusals: int,
                   budget_s: float) -> TransportOverloaded:
    if refusal is None:
        return TransportOverloaded(503, None, f"retriever overloaded: no room within {budget_s:g} s; "
                                              f"try again later")
    return TransportOverloaded(refusal.status, refusal.retry_after,
                               f"retriever overloaded: refused {refusals} time(s) within "
                               f"{budget_s:g} s; try again later", refusal.retry_after_ms)


def _check_inputs(items: list, doc_ids: list, name: str) -> None:
    if len(items) != len(doc_ids):
        raise ValueError(f"{name} and doc_ids differ in length: {len(items)} != {len(doc_ids)}")
    if not all(isinstance(d, str) for d in doc_ids):
        raise ValueError("doc_ids must be strings")
    if name == "queries" and not all(isinstance(q, str) for q in items):
        raise ValueError("queries must be strings")
