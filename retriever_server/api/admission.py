"""Admission control: bounded work in flight, a short queue, explicit refusals.

Contract (per server process):

- at most ``max_in_flight`` gated requests run at once; further ones wait in a FIFO queue; of
  those running, at most ``threads`` compute at once (``ComputeThreads``), the others wait for
  a thread on the event loop;
- a request's queue budget is ``min(max_wait_s, queue_services x service_s)``, ``service_s``
  being the measured mean time a request holds a slot (``queue_services=None``: ``max_wait_s``
  alone). It is queued only while the queue holds fewer than ``max_queue`` requests AND its
  predicted wait (queue position x service_s / max_in_flight) is within the budget; otherwise
  it is refused at once;
- a queued request that has not started within four times its budget (never more than
  ``max_wait_s``) is refused, never served late;
- a refusal is ``503`` with ``Retry-After`` (whole seconds, rounded down: the predicted time for
  the current backlog to drain, so often ``0``: "retry soon, with backoff"), the same
  prediction in milliseconds in ``Retry-After-Ms`` (rounded up; as some public APIs send it),
  and a JSON ``detail``.

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

from .. import contract

T = TypeVar("T")


@dataclass(frozen=True)
class AdmissionLimits:
    # Requests holding a slot at once. One process computes on one core at a time (the GIL),
    # so more slots only share it: each answer takes longer, none more are served (measured on
    # 2 cores: with 2 slots a closed loop ran as fast as with 8, and an 8x flood got no fewer
    # answers, each in a fraction of the time).
    max_in_flight: int = 2
    # Threads computing answers at once (at most max_in_flight matter); each competes with the
    # event loop (refusals, /health) for the GIL.
    threads: int = 2
    max_queue: int = 128
    # The longest any request may wait for a slot, whatever the service time.
    max_wait_s: float = 1.0
    # Queue budget in mean service times: a request waits about one service for a slot (with 2
    # slots: 2 queued), so an answered request takes two services, not a queue's worth of them;
    # past that, refusing at once lets the client go elsewhere or come back when told. None:
    # queue up to max_wait_s (plain clients that do not retry refusals).
    queue_services: float | None = 1.0

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_queue < 0 or self.max_wait_s <= 0 or self.threads < 1:
            raise ValueError("admission needs max_in_flight >= 1, max_queue >= 0, max_wait_s > 0, "
                             "threads >= 1")
        if self.queue_services is not None and self.queue_services <= 0:
            raise ValueError("admission needs queue_services > 0 (or None)")


@dataclass(frozen=True)
class Refusal:
    reason: str  # "queue_full" | "deadline"
    retry_after_s: int
    retry_after_ms: int = 0  # the same prediction, finer: clients that read it come back sooner

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
    _DEADLINE_BUDGETS = 4

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

    def queue_budget(self) -> float:
        """Seconds a request may expect to wait for a slot now."""
        if self.limits.queue_services is None:
            return self.limits.max_wait_s
        return min(self.limits.max_wait_s, self.limits.queue_services * self.service_s)

    def drain_s(self) -> float:
        """Predicted seconds for the current backlog to drain."""
        return (self.in_flight + len(self._waiters)) * self.service_s / self.limits.max_in_flight

    def retry_after(self) -> int:
        # Rounded down: a backlog that drains in 0.3 s should not keep clients away for a whole
        # second (the server would idle); clients add their own jittered backoff on top.
        return math.floor(self.drain_s())

    def refusal(self, reason: str) -> Refusal:
        drain = self.drain_s()
        return Refusal(reason, math.floor(drain), max(1, math.ceil(1000 * drain)))

    async def enter(self) -> Refusal | None:
        """None when the caller holds a slot (it must call ``leave``); else the refusal."""
        if self.in_flight < self.limits.max_in_flight and not self._waiters:
            self.in_flight += 1
            return None
        position = len(self._waiters) + 1
        budget = self.queue_budget()
        if position > self.limits.max_queue or self.predicted_wait(position) > budget * (1 + 1e-9):
            return self.refusal("queue_full")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._waiters.append(fut)
        # Four times the budget: a request is not refused for an ordinary spread of service
        # times (with twice, a closed loop within capacity saw refusals on a shared machine),
        # only when the queue is stuck.
        timer = loop.call_later(min(self.limits.max_wait_s, self._DEADLINE_BUDGETS * budget),
                                self._expire, fut)
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
        return None if granted else self.refusal("deadline")

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
               (b"retry-after", str(refusal.retry_after_s).encode()),
               (contract.RETRY_AFTER_MS.lower().encode(), str(refusal.retry_after_ms).encode())]
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
