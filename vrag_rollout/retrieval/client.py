"""`RetrieverClient`: the batched client for the page retriever (wire format: ALDEN's
`/batch_search`, `/batch_fetch`, and this project's `/batch_crop`).

Three layers, so the fault handling is written once:

- pure functions (`wire`) build request bodies and turn a parsed response into, per item, a
  `RetrievedPage` (or a list of them) or a `RetrieverFailure` (`types`);
- a *transport* (`transport`) does one logical call, `post(path, body, timeout) -> parsed JSON`,
  and raises a `TransportError` subclass (timeout, connection, http status, malformed body) when
  it cannot. The client's default is `aio.AsyncHttpTransport` (aiohttp, on the client's own
  event loop: `send_async`); `blocking.HttpTransport` (urllib3, blocking) has the same retry
  policy for direct use and recording; `fixtures.FixtureTransport` replays recorded traffic
  through the very same client logic (blocking transports run in a small thread pool);
- `RetrieverClient` (this module) chunks a batch (at most `max_batch` items a request), runs the
  chunks concurrently on its event loop (a daemon thread, `aio.LoopThread`; `batch_*` block the
  calling thread until the batch is done) under a cap of `max_concurrency` chunks at once,
  validates the answers and counts what happened in `stats` (`stats.ClientStats`).

Replicas: `base_url` may name several servers (a list, or one comma-separated string). Chunks
go round-robin over them; a replica that fails a chunk (connection, timeout, 5xx after its
retries) is skipped for `down_s` seconds and the chunk moves to the next one
(`congestion.ReplicaSet`).

Overload: a server that refuses with 503/429 *and* `Retry-After` (admission control) is not
retried by the transport. Each replica has an `AdaptiveLimit` (`congestion`), a congestion
window clocked by answers: at most `max_concurrency` requests in flight to it; a refusal halves
the window (once per round) and caps it at the requests still at that server, so the refused
chunk waits in the client until one of them is answered; a refusal that leaves nothing in
flight closes the window for the server's hint: `Retry-After-Ms` when the server sends it (this
project's server does), else `Retry-After` (at least `backoff`), doubling per refusal of the
chunk up to 8x, times a random factor in [1, 1.5) (so refused clients do not return in
lockstep). Answers regrow the window. A refused chunk first moves to another replica that is not
refusing. A chunk gets at most `overload_budget_s` seconds in all (waiting for room counts too:
in a window, or for a slot under `max_concurrency` while other callers' chunks hold them); then
every item of it becomes a `RetrieverFailure("overloaded", ...)`. Refusals are counted in
`stats.overloaded`, apart from failures. Answers are decoded after the window's slot is given
back: the window counts requests the server holds, not the client's own work.

Crops (`batch_crop`) go through the same machinery, chunked at most `contract.crops_per_request`
a request; a box that is not a region of a page (`contract.box_problem`) is answered here as a
"request" failure with the server's own reason, without a round trip.

Network and server faults, and whatever garbage a server sends, never escape `batch_search` /
`batch_fetch` / `batch_crop` as an exception or a `None`: every item of an affected chunk becomes a
`RetrieverFailure` whose message can be shown to the model as an observation. Programming
errors (mismatched list lengths, `top_n < 1`, a bad `FetchSpec`, a crop page < 1 or a bad pixel
band) raise `ValueError`.

Threads and deadlines: `batch_*`, `health` and `close` may be called from any number of threads
at once. Each try is bounded by `timeout` (connect + read); one logical call to one replica by
`call_bound_s` (its tries and the backoff between them; a blocking transport that overstays it
fails as a timeout); a chunk by `overload_budget_s` plus one such call per replica; and so a `batch_*`
call by `deadline_s`: past it (only if the client's event loop is stuck) the caller gets
`TimeoutError`. `close()` (or collection, from any thread, finalizers on the client's own
threads included) ends the calls in flight at once: their callers, and later calls, raise
`RuntimeError("this RetrieverClient is closed")`. A forked child gets a fresh client (its own
loop, pool, connections, windows and zeroed stats; `os.register_at_fork`, see `forking`); a
transport passed in as `transport=` is the caller's to make fork-safe (this package's HTTP
transports are).

Answer format: the HTTP transports ask for MessagePack, else read JSON (see `transport`);
images are NOT decoded here (see `types`).

Re-exported here (see `__all__`): the public data types, transport errors and `HttpTransport`.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence, Union

from . import forking
from .blocking import HttpTransport
from .congestion import AdaptiveLimit, ReplicaSet, parse_urls
from .stats import ClientStats
from .transport import (Transport, TransportConnectionError, TransportError, TransportHTTPError,
                        TransportMalformed, TransportOverloaded, TransportTimeout, call_bound_s,
                        decode_answer)
from .types import FAILURE_KINDS, MODALITIES, FetchSpec, RetrievedPage, RetrieverFailure
from retriever_server import contract

from .wire import (MalformedResponse, crop_body, fetch_body, parse_crop_results, parse_fetch_results,
                   parse_search_results, search_body)

__all__ = [  # RetrieverClient, and re-exported where callers have always imported them from
    "RetrieverClient", "RetrievedPage", "RetrieverFailure", "FetchSpec", "MODALITIES", "FAILURE_KINDS",
    "TransportError", "TransportTimeout", "TransportConnectionError", "TransportHTTPError",
    "TransportMalformed", "TransportOverloaded", "HttpTransport",
]

# A call's deadline allows this much beyond what the transports' own timeouts add up to: the
# client's own work (scheduling, decoding); those timeouts fire first unless something is stuck.
SLACK_S = 1.0


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
        from .aio import AsyncHttpTransport  # aiohttp (0.15 s to import): once a client is made

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
        forking.register(self)

    def _start(self) -> None:
        """This process's machinery: the loop and its state, the pool, the finalizer."""
        from .aio import LoopThread

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
            forking.keep_inherited(inherited[2])  # (loop, transports, pool), not the client itself
            self._start()

    # -- public API

    def batch_search(self, queries: list[str], doc_ids: list[str | None], top_n: int) -> list[list[RetrievedPage] | RetrieverFailure]:
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

    def batch_crop(
        self,
        doc_ids: list[str],
        pages: list[int],
        boxes: list[Sequence[float]],
        min_pixels: int,
        max_pixels: int,
        *,
        factor: int = contract.CROP_FACTOR,
    ) -> list[RetrievedPage | RetrieverFailure]:
        """Per crop, an image `RetrievedPage` of region `boxes[i]` ([x1, y1, x2, y2], fractions
        0..1 of the page, top left first) of 1-based page `pages[i]` of `doc_ids[i]`, with
        between `min_pixels` and `max_pixels` pixels and sides multiples of `factor`; or a
        `RetrieverFailure` ("request" for a bad box, an unknown document or a page out of
        range: the asker's mistakes)."""
        doc_ids, pages, boxes = list(doc_ids), list(pages), list(boxes)
        _check_inputs(pages, doc_ids, "pages")
        if len(boxes) != len(pages):
            raise ValueError(f"boxes and pages differ in length: {len(boxes)} != {len(pages)}")
        if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in pages):
            raise ValueError("pages must be ints >= 1 (1-based)")
        if problem := contract.crop_band_problem(min_pixels, max_pixels, factor):
            raise ValueError(problem)
        out: list = [None] * len(pages)
        sent = []
        for i, box in enumerate(boxes):
            if problem := contract.box_problem(box):
                out[i] = RetrieverFailure("request", problem)  # the server's own reason
            else:
                sent.append(i)
        ids = [doc_ids[i] for i in sent]
        numbers = [pages[i] for i in sent]
        regions = [[float(v) for v in boxes[i]] for i in sent]

        def chunk(lo: int, hi: int):
            body = crop_body(ids[lo:hi], numbers[lo:hi], regions[lo:hi], min_pixels, max_pixels, factor)
            return "/batch_crop", body, lambda data: parse_crop_results(data, ids[lo:hi], numbers[lo:hi], regions[lo:hi])

        # a request may draw only so many pixels: at larger bands, fewer crops a request
        per_request = min(self.max_batch, contract.crops_per_request(max_pixels))
        for i, result in zip(sent, self._run(len(sent), chunk, per_request)):
            out[i] = result
        return out

    def health(self) -> bool:
        """True when at least one replica answers /health (one try each)."""
        return self._loop.run(self._health(), len(self.transports) * (self.timeout + SLACK_S) + SLACK_S)

    def documents(self) -> Optional[dict[str, int]]:
        """{doc_id: num_pages} the retriever serves (GET /documents, first replica that answers);
        None when the replica that answers cannot list them (recorded fixtures, a server without
        the route or with an answer not in the contract's shape).
        Raises `TransportError` when no replica answers at all."""
        return self._loop.run(self._documents(), len(self.transports) * (self.timeout + SLACK_S) + SLACK_S)

    def close(self) -> None:
        """Calls in flight raise RuntimeError at once, as later calls do. From any thread."""
        self._closer()  # once: later calls do nothing

    def __enter__(self) -> "RetrieverClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals

    async def _get(self, transport: Any, path: str) -> Any:
        if hasattr(transport, "get_async"):
            probe = transport.get_async(path, self.timeout)
        else:
            probe = asyncio.get_running_loop().run_in_executor(self._pool, transport.get, path, self.timeout)
        return await asyncio.wait_for(probe, self.timeout + SLACK_S)

    async def _health(self) -> bool:
        for transport in self.transports:
            try:
                await self._get(transport, "/health")
            except (TransportError, asyncio.TimeoutError):
                continue
            return True
        return False

    async def _documents(self) -> Optional[dict[str, int]]:
        last: Optional[BaseException] = None
        for transport in self.transports:
            try:
                listing = await self._get(transport, "/documents")
            except TransportHTTPError:
                return None  # it answered, without the route: an older server or a replay
            except (TransportError, asyncio.TimeoutError) as error:
                last = error
                continue
            try:
                return {str(doc["doc_id"]): int(doc["num_pages"]) for doc in listing["documents"]}
            except (TypeError, KeyError, ValueError):
                return None  # it answered, but no listing it can read: as good as no route
        raise last if isinstance(last, TransportError) else TransportTimeout("retriever unreachable")

    def _run(self, n: int, chunk: Callable[[int, int], tuple], max_batch: Optional[int] = None) -> list:
        size = max_batch or self.max_batch
        bounds = [(lo, min(lo + size, n)) for lo in range(0, n, size)]
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
    if name == "queries":  # a search may have no document: it ranks the whole corpus
        if not all(d is None or isinstance(d, str) for d in doc_ids):
            raise ValueError("doc_ids must be strings, or None to search the whole corpus")
    elif not all(isinstance(d, str) for d in doc_ids):
        raise ValueError("doc_ids must be strings")
    if name == "queries" and not all(isinstance(q, str) for q in items):
        raise ValueError("queries must be strings")
