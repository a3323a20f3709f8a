"""Admission control: bounded work in flight, a bounded queue, explicit refusals.

Contract (per server process):

- at most ``max_in_flight`` gated requests run at once; further ones wait in a FIFO queue; of
  those running, at most ``threads`` compute at once (``ComputeThreads``), the others wait for
  a thread on the event loop;
- a request is queued only while the queue holds fewer than ``max_queue`` requests AND its
  predicted wait (queue position x mean service time / max_in_flight) is within ``max_wait_s``;
  otherwise it is refused at once;
- a queued request that has not started when its deadline (arrival + ``max_wait_s``) passes is
  refused, never served late;
- a refusal is ``503`` with ``Retry-After`` (whole seconds, rounded down: the predicted time for
  the current backlog to drain, so often ``0``: "retry soon, with backoff") and a JSON
  ``detail``.

Routes that are not gated (``/health``, ``/ready``, ``/metrics``) never wait here. All
bookkeeping runs on the event-loop thread, so it needs no locks.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


@dataclass(frozen=True)
class AdmissionLimits:
    # Requests holding a slot at once. A slot is held from admission to the last byte sent, and
    # under a flood most of that is waiting for event-loop turns (body, hand-off to a thread,
    # send), not computing; too few slots then starve the work (measured: 2 slots served 4x
    # fewer requests than 8 under an 8x flood on 2 cores).
    max_in_flight: int = 8
    # Threads computing answers at once (at most max_in_flight matter). Each competes with the
    # event loop for the GIL: fewer leave the loop more turns (refusals, /health), but in an 8x
    # flood on 2 shared cores 8 threads answered more requests than 2, so none are held back.
    threads: int = 8
    max_queue: int = 128
    # Longest a request may wait for a slot: a training step's burst of about a second of work is
    # queued and served; beyond that clients are refused (the rollout client waits Retry-After,
    # at least 1 s, and retries, or goes to another replica). Lower it to bound the latency of
    # answered requests: their p99 is about max_wait_s plus one request's work.
    max_wait_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_queue < 0 or self.max_wait_s <= 0 or self.threads < 1:
            raise ValueError("admission needs max_in_flight >= 1, max_queue >= 0, max_wait_s > 0, "
                             "threads >= 1")


@dataclass(frozen=True)
class Refusal:
    reason: str  # "queue_full" | "deadline"
    retry_after_s: int

    def detail(self) -> str:
        why = ("the request queue is full" if self.reason == "queue_full"
               else "the request waited past its deadline")
        return (f"retriever overloaded ({why}); retry after {self.retry_after_s} s, or on "
                f"another replica")


class AdmissionGate:
    """The gate's state machine; ``enter`` / ``leave`` must be called on the event-loop thread."""

    # Mean service time before any request finished; replaced by the first measurement.
    _INITIAL_SERVICE_S = 0.01
    _EWMA = 0.2

    def __init__(self, limits: AdmissionLimits = AdmissionLimits(),
                 clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock = clock
        self.in_flight = 0
        self._waiters: deque[asyncio.Future] = deque()
        self.service_s = self._INITIAL_SERVICE_S

    @property
    def queued(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def predicted_wait(self, position: int) -> float:
        """Seconds until the request at queue ``position`` (1-based) gets a slot, on average."""
        return position * self.service_s / self.limits.max_in_flight

    def retry_after(self) -> int:
        # Rounded down: a backlog that drains in 0.3 s should not keep clients away for a whole
        # second (the server would idle); clients add their own jittered backoff on top.
        backlog = self.in_flight + len(self._waiters)
        return math.floor(backlog * self.service_s / self.limits.max_in_flight)

    async def enter(self) -> Refusal | None:
        """None when the caller holds a slot (it must call ``leave``); else the refusal."""
        if self.in_flight < self.limits.max_in_flight and not self._waiters:
            self.in_flight += 1
            return None
        position = len(self._waiters) + 1
        if position > self.limits.max_queue or self.predicted_wait(position) > self.limits.max_wait_s:
            return Refusal("queue_full", self.retry_after())
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._waiters.append(fut)
        timer = loop.call_later(self.limits.max_wait_s, self._expire, fut)
        try:
            granted = await fut
        except asyncio.CancelledError:
            # The client went away (or the server stops). A slot handed over at that very moment
            # must not leak.
            if fut.done() and not fut.cancelled() and fut.result():
                self._pass_slot_on()
            raise
        finally:
            timer.cancel()
            if fut in self._waiters:
                self._waiters.remove(fut)
        return None if granted else Refusal("deadline", self.retry_after())

    def leave(self, service_s: float) -> None:
        """Give the slot back; ``service_s`` is how long the request held it."""
        self.service_s += self._EWMA * (max(service_s, 0.0) - self.service_s)
        self._pass_slot_on()

    def _pass_slot_on(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)  # the slot moves to the next waiter; in_flight unchanged
                return
        self.in_flight -= 1

    def _expire(self, fut: asyncio.Future) -> None:
        if not fut.done():
            fut.set_result(False)


class ComputeThreads:
    """Runs blocking work in worker threads, at most ``n`` at once (one limiter per event loop:
    an app may be served by several loops over its life, e.g. in tests)."""

    def __init__(self, n: int):
        self.n = n
        self._limiters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        limiter = self._limiters.get(loop)
        if limiter is None:
            limiter = self._limiters[loop] = anyio.CapacityLimiter(self.n)
        return await anyio.to_thread.run_sync(fn, limiter=limiter)


def refusal_response_parts(refusal: Refusal) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"detail": refusal.detail()}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(refusal.retry_after_s).encode())]
    return headers, body


class AdmissionMiddleware:
    """Pure ASGI middleware: gates the routes in ``gated``, times every request for metrics.

    ``observe(route, status, seconds)`` and ``refused(route, reason)`` are metric callbacks.
    """

    def __init__(self, app, gate: AdmissionGate, gated: frozenset[str],
                 observe: Callable[[str, int, float], None],
                 refused: Callable[[str, str], None], known: frozenset[str]):
        self.app, self.gate, self.gated = app, gate, gated
        self._observe, self._refused, self._known = observe, refused, known

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in self._known else "other"  # bounded label cardinality
        start = time.perf_counter()
        status = 500
        slot = False

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if path in self.gated:
                refusal = await self.gate.enter()
                if refusal is not None:
                    status = 503
                    self._refused(route, refusal.reason)
                    headers, body = refusal_response_parts(refusal)
                    await send({"type": "http.response.start", "status": 503, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                    return
                slot = True
                began = time.perf_counter()
            await self.app(scope, receive, send_status)
        finally:
            if slot:
                self.gate.leave(time.perf_counter() - began)
            self._observe(route, status, time.perf_counter() - start)
