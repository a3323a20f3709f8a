"""`ClientStats`: what a `RetrieverClient` counts, for metrics.

Contract: thread-safe counters (written by the client's loop and pool threads, read by anyone);
`snapshot()` gives flat floats (``calls``, ``items``, ``retries``, ``overloaded``,
``overload_wait_s``, ``failovers``, ``failures`` and ``failures/<kind>`` for each of
`FAILURE_KINDS`, ``latency_s``, ``latency_max_s``, ``latency_mean_s``); `reset()` zeroes them.
Refusals (503/429 with Retry-After) are counted in ``overloaded``, apart from failures. A forked
child starts from zero with a fresh lock.
"""

from __future__ import annotations

import threading
from typing import Sequence

from . import forking
from .types import FAILURE_KINDS, RetrieverFailure


class ClientStats:
    """Counters for metrics. Thread-safe; `snapshot()` gives flat floats, `reset()` zeroes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()
        forking.register(self)

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
