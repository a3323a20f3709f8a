"""The rollout client's event-loop side: a private asyncio loop in a daemon thread, and an aiohttp
transport with the same policy as `retriever_client.HttpTransport`.

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
`TransportError` subclasses, with the same messages, as `HttpTransport`.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from typing import Any, Awaitable, Callable, Optional, TypeVar

import aiohttp

from retriever_server import contract

from .retriever_client import (
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

T = TypeVar("T")
_BACKOFF_MAX_S = 10.0


class LoopThread:
    """An asyncio event loop running in a daemon thread; `run` blocks the caller until a
    coroutine finishes there (callable from any thread but the loop's own)."""

    def __init__(self, name: str = "retriever-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self, final: Optional[Callable[[], Awaitable[Any]]] = None) -> None:
        """Run ``final()`` on the loop (e.g. closing sessions), then stop and close it."""
        if self.loop.is_closed():
            return
        if final is not None:
            self.run(final())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class AsyncHttpTransport(HttpSettings):
    """aiohttp transport: see the module docstring. Settings: `HttpSettings`. Create and use it
    on one event loop."""

    def __init__(self, base_url: str, **settings: Any):
        super().__init__(base_url, **settings)
        self._session: Optional[aiohttp.ClientSession] = None
        self._rng = random.Random()

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
        return min(_BACKOFF_MAX_S, self._backoff * 2 ** (attempt - 1)
                   + self._rng.random() * self._backoff / 2)

    def _done(self, error: TransportError, attempt: int) -> TransportError:
        self._count_retries(attempt - 1)
        return error
