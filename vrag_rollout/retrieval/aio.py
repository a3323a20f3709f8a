"""The rollout client's event-loop side: a private asyncio loop in a daemon thread, and an aiohttp
transport with the same policy as `blocking.HttpTransport`.

Why: with a thread per request in flight, the answer that frees a place at a busy server has to
wake another thread to send the next request; on a loaded core that wake-up waits for the
scheduler while the server, holding only what its admission control lets in, runs dry. On one
loop the answer's callback sends the next request itself (measured in the overload benchmark
with the server on a core of its own: 1.15-1.23x the time the server's sustainable rate allows,
against 1.35-1.46x with threads, and about a third less client CPU per answer).

`AsyncHttpTransport.send_async(path, body, timeout) -> RawAnswer` makes one logical call: at most
``retries + 1`` tries, each bounded by ``timeout`` seconds (connect + read); timeouts, connection
errors, 5xx and 429 are tried again after 0, 2 x backoff, 4 x backoff, ... seconds (plus up to
half a backoff of jitter, at most 10 s); other statuses are not. A 503/429 carrying
``Retry-After`` is an admission-control refusal and is raised at once as `TransportOverloaded`
(the client decides: wait in its window, or another replica). Failures raise the same
`TransportError` subclasses, with the same messages, as `HttpTransport`; the shared policy and
settings are `transport`'s (`HttpSettings`). Fork-safe: a forked child starts a new session.

`LoopThread` is `client.RetrieverClient`'s loop; a call on a closed one raises
`RuntimeError(CLOSED)`. Imports `transport` and `forking`, never `client` (which imports this).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import threading
from typing import Any, Awaitable, Callable, Coroutine, Optional, TypeVar

import aiohttp

from retriever_server import contract

from . import forking
from .transport import (
    BACKOFF_MAX_S,
    REFUSAL_STATUSES,
    RETRY_STATUSES,
    HttpSettings,
    RawAnswer,
    TransportConnectionError,
    TransportError,
    TransportHTTPError,
    TransportMalformed,
    TransportOverloaded,
    TransportTimeout,
    decode_json,
    parse_retry_after,
    retry_after_ms,
    tries_text,
)

CLOSED = "this RetrieverClient is closed"  # what a call on a closed client raises
T = TypeVar("T")


class LoopThread:
    """An asyncio event loop in a daemon thread (started by the first `run`): the client's, in
    the process that made it.

    `run(coro, timeout)` blocks the calling thread until the coroutine finishes on the loop, at
    most ``timeout`` seconds (then it is cancelled and TimeoutError raised). `close` may be called
    from any thread, a finalizer's included (on the loop's own thread it does not wait for the
    loop). `_lock` guards `_closed`, `_thread` and `_calls` (the futures of the callers waiting
    in `run`): a call either starts before `close`, which cancels it (its caller raises
    RuntimeError at once), or finds the loop closed. Where the loop cannot answer, `run` raises
    RuntimeError at once: from the loop's own thread (it would wait for itself) and in a forked
    child (the thread is the parent's)."""

    def __init__(self, name: str = "retriever-loop"):
        self.loop = asyncio.new_event_loop()
        self._name = name
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._calls: set[concurrent.futures.Future] = set()

    def _main(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()  # here, so a close() on this thread need not wait for it

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if os.getpid() != self._pid:  # before the lock: a parent's thread may have held it
            _refuse(coro, "this event loop is the parent process's (this one is a forked child)")
        if threading.current_thread() is self._thread:
            _refuse(coro, "a RetrieverClient cannot be called from its own event loop's thread")
        with self._lock:
            if self._closed:
                _refuse(coro, CLOSED)
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
                self._thread.start()
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._calls.add(future)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            raise RuntimeError(CLOSED) from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"retriever client: no answer within {timeout:g} s "
                               f"(its event loop or a transport is stuck)") from None
        finally:
            with self._lock:
                self._calls.discard(future)

    def close(self, final: Optional[Callable[[], Awaitable[Any]]] = None, wait_s: float = 5.0) -> None:
        """Cancel the calls in flight, run ``final()`` on the loop (e.g. closing sessions), stop
        and close it; waits at most about 2 x ``wait_s`` (closing is local work)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            calls, self._calls = self._calls, set()
            thread = self._thread
        for future in calls:
            future.cancel()
        if os.getpid() != self._pid:
            return  # a forked child: the loop and its thread are the parent's
        if thread is None:  # never run: nothing was made on it
            self.loop.close()
            return
        try:
            finished = asyncio.run_coroutine_threadsafe(self._finish(final, wait_s), self.loop)
        except RuntimeError:  # the loop is closed already
            return
        if threading.current_thread() is thread:
            return  # a finalizer on the loop itself: _finish runs once it returns
        try:
            finished.result(wait_s)
        except concurrent.futures.TimeoutError:
            pass  # the loop is stuck: leave it to its daemon thread
        thread.join(wait_s)

    async def _finish(self, final: Optional[Callable[[], Awaitable[Any]]], wait_s: float) -> None:
        try:
            # The calls' tasks end first, so no request is left using a session being closed.
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=wait_s)
            if final is not None:
                await asyncio.wait_for(final(), wait_s)
        finally:
            # Stop on the next round, after this task's result has reached close().
            self.loop.call_soon(self.loop.stop)


def _refuse(coro: Coroutine[Any, Any, Any], message: str) -> None:
    coro.close()  # never to run: no "was never awaited" warning
    raise RuntimeError(message)


class AsyncHttpTransport(HttpSettings):
    """aiohttp transport: see the module docstring. Settings: `HttpSettings`. Create and use it
    on one event loop; in a forked child it starts a new session."""

    def __init__(self, base_url: str, **settings: Any):
        super().__init__(base_url, **settings)
        self._session: Optional[aiohttp.ClientSession] = None
        self._rng = random.Random()
        forking.register(self)

    def _after_fork_in_child(self) -> None:
        # The session's connections are the parent's sockets, on the parent's loop.
        if self._session is not None:
            forking.keep_inherited(self._session)
            self._session = None
        self._rng = random.Random()  # else parent and child jitter in lockstep

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the loop that uses it, as aiohttp requires
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                headers=self._headers)
        return self._session

    async def send_async(self, path: str, body: dict, timeout: float) -> RawAnswer:
        data = json.dumps(body).encode("utf-8")
        tries = self._retries + 1
        for attempt in range(1, tries + 1):
            last = attempt == tries
            try:
                async with self._client().post(self.base_url + path, data=data,
                                               timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    status, headers = resp.status, resp.headers
                    payload = await resp.read()
            except asyncio.TimeoutError as e:
                if last:
                    raise self._done(TransportTimeout(f"retriever timed out after {tries_text(attempt)}",
                                                      tries=attempt), attempt) from e
            except aiohttp.ClientConnectorError as e:
                if last or self._fail_fast_on_connect:
                    raise self._done(TransportConnectionError(
                        f"retriever unreachable after {tries_text(attempt)}", tries=attempt), attempt) from e
            except (aiohttp.ClientError, OSError) as e:
                if last:
                    raise self._done(TransportConnectionError(
                        f"retriever connection failed after {tries_text(attempt)}", tries=attempt), attempt) from e
            else:
                if status in REFUSAL_STATUSES and headers.get("Retry-After"):
                    self._count_retries(attempt - 1)
                    raise TransportOverloaded(status, parse_retry_after(headers["Retry-After"]),
                                              f"retriever overloaded (HTTP {status})",
                                              retry_after_ms(headers.get(contract.RETRY_AFTER_MS)))
                if 200 <= status < 300:
                    self._count_retries(attempt - 1)
                    return RawAnswer(payload, headers.get("Content-Type"))
                if status not in RETRY_STATUSES or last:
                    raise self._done(TransportHTTPError(
                        status, f"retriever answered HTTP {status} after {tries_text(attempt)}",
                        tries=attempt), attempt)
            await asyncio.sleep(self._backoff_s(attempt))
        raise AssertionError("unreachable: the last try returns or raises")

    async def get_async(self, path: str, timeout: float) -> Any:
        """A health probe: one try; the parsed JSON, or None for a body that is not JSON."""
        try:
            async with self._client().get(self.base_url + path,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                status, payload = resp.status, await resp.read()
        except asyncio.TimeoutError as e:
            raise TransportTimeout("retriever timed out after 1 try") from e
        except (aiohttp.ClientError, OSError) as e:
            raise TransportConnectionError("retriever unreachable after 1 try") from e
        if not 200 <= status < 300:
            raise TransportHTTPError(status, f"retriever answered HTTP {status} after 1 try")
        try:
            return decode_json(payload)
        except TransportMalformed:
            return None  # a plain-text "ok" is still a healthy server

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _backoff_s(self, attempt: int) -> float:
        # The same schedule as urllib3's Retry in HttpTransport: no wait before the second try,
        # then 2, 4, ... x backoff with up to half a backoff of jitter.
        if attempt <= 1 or self._backoff <= 0:
            return 0.0
        return min(BACKOFF_MAX_S, self._backoff * 2 ** (attempt - 1)
                   + self._rng.random() * self._backoff / 2)

    def _done(self, error: TransportError, attempt: int) -> TransportError:
        self._count_retries(attempt - 1)
        return error
