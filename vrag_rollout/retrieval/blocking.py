"""`HttpTransport`: the blocking HTTP transport (urllib3), for direct use and for recording.

Contract (`transport.Transport`, with ``send``): one logical call per ``post``/``send``, blocking
the calling thread. Retries (with exponential backoff) live in urllib3's `Retry`: timeouts,
connection errors, 5xx and 429 are retried; other statuses are not; each try is bounded by
``timeout`` (connect + read), the whole call by `transport.call_bound_s`. A 503/429 carrying
``Retry-After`` is an admission-control refusal and goes back to the caller at once as
`TransportOverloaded` (it may wait, or go to another replica). Failures raise the same
`TransportError` subclasses, with the same messages, as `aio.AsyncHttpTransport`; settings:
`transport.HttpSettings`. Fork-safe: a forked child opens its own connections. Inside
`RetrieverClient` a blocking transport runs in the client's small thread pool.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from urllib3.exceptions import HTTPError as _Urllib3Error
from urllib3.exceptions import MaxRetryError, NewConnectionError
from urllib3.exceptions import TimeoutError as _Urllib3Timeout
from urllib3.util import Retry, Timeout

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
    decode_answer,
    decode_json,
    parse_retry_after,
    retry_after_ms,
    tries_text,
)


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
        forking.register(self)

    def _new_pool(self) -> urllib3.PoolManager:
        return urllib3.PoolManager(num_pools=4, maxsize=self._max_connections, block=False)

    def _after_fork_in_child(self) -> None:
        # The pooled connections are the parent's sockets: two processes on one would read
        # each other's answers.
        forking.keep_inherited(self._pool)
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


def _classify(reason: BaseException | None, tries: int) -> TransportError:
    # NewConnectionError subclasses ConnectTimeoutError: test it first (refused != slow).
    if isinstance(reason, NewConnectionError):
        return TransportConnectionError(f"retriever unreachable after {tries_text(tries)}", tries=tries)
    if isinstance(reason, (_Urllib3Timeout, TimeoutError)):
        return TransportTimeout(f"retriever timed out after {tries_text(tries)}", tries=tries)
    return TransportConnectionError(f"retriever connection failed after {tries_text(tries)}", tries=tries)
