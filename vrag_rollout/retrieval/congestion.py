"""Where a chunk goes and when it may go: replica choice and per-replica congestion windows.

- `parse_urls`: a client's ``base_url`` (one URL, a list, or one comma-separated string) as a
  list of replica URLs.
- `ReplicaSet`: chunks go round-robin over the replicas; a replica marked down (it failed a
  chunk: for ``down_s`` seconds; it refused one: until its Retry-After) is tried last.
  Thread-safe.
- `AdaptiveLimit`: one per replica, a congestion window clocked by answers: at most
  ``max_concurrency`` requests in flight to it; a refusal halves the window (once per round)
  and caps it at the requests still at that server, so the refused chunk waits in the client
  until one of them is answered; a refusal that leaves nothing in flight closes the window for
  the server's hint (the pause the client computes from ``Retry-After-Ms`` / ``Retry-After``).
  Answers regrow the window. The window counts requests the server holds, not the client's
  own work: the client gives its slot back before decoding an answer. Used on one event loop
  (the client's).

No I/O and nothing of the transports: `client.RetrieverClient` applies these to its calls.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Callable, Optional, Sequence, Union


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
