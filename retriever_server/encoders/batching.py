"""Query encoding batched across concurrent callers.

Contract: ``QueryBatcher(encode)`` owns one collector thread. ``batcher.encode(queries)``, called
from any number of threads, hands the queries to the collector and waits for its own rows. The
collector takes the first waiting request, gathers more for up to ``window_s`` (or until
``max_batch`` queries), calls ``encode`` once on all of them, and hands each caller its own slice.

Invariants:
- A caller gets exactly ``encode(batch)``'s rows for its own queries, in its order.
- An exception from ``encode`` reaches every caller of that batch; the next batch runs normally.
- Every caller's wait has a deadline (``timeout_s``): past it the caller gets ``TimeoutError``
  and its request, if not yet started, is dropped (never a hang).
- Only the collector thread calls ``encode``; the queue is the only state shared with callers.
- ``close()`` stops the collector; requests still queued then fail with ``RuntimeError``.

While the model runs one batch, new requests queue up and form the next batch, so under load
batches grow by themselves; the window only gathers a burst that arrives together.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # the builtin TimeoutError from 3.11 on
from dataclasses import dataclass, field

_STOP = object()


@dataclass
class _Request:
    queries: list
    future: Future = field(default_factory=Future)


class QueryBatcher:
    def __init__(self, encode: Callable[[list], list], *, max_batch: int = 64,
                 window_s: float = 0.002, timeout_s: float = 60.0, name: str = "query-batcher"):
        self._encode = encode
        self.max_batch, self.window_s, self.timeout_s = max_batch, window_s, timeout_s
        self.calls = 0  # model calls made (written by the collector thread only)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _closed against a racing close()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def encode(self, queries: list, timeout_s: float | None = None) -> list:
        """Rows for ``queries`` from a shared model call; TimeoutError past the deadline."""
        if not queries:
            return []
        request = _Request(list(queries))
        with self._lock:
            if self._closed:
                raise RuntimeError("the query batcher is closed")
            self._queue.put(request)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return request.future.result(timeout=timeout)
        except FutureTimeout:
            if request.future.cancel() or not request.future.done():
                raise TimeoutError(f"query encoding did not finish within {timeout:g}s") from None
            return request.future.result(timeout=0)  # finished in the meantime

    def _gather(self, first: _Request) -> tuple[list[_Request], bool]:
        """``first`` plus what arrives within the window (up to max_batch); and whether to stop."""
        batch, count = [first], len(first.queries)
        deadline = time.monotonic() + self.window_s
        while count < self.max_batch:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
            count += len(item.queries)
        return batch, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                break
            batch, stop = self._gather(first)
            # A caller that timed out has cancelled its request: leave it out.
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if live:
                self._run_batch(live)
        self._fail_queued()

    def _run_batch(self, requests: list[_Request]) -> None:
        queries = [q for r in requests for q in r.queries]
        self.calls += 1
        try:
            rows = self._encode(queries)
            if len(rows) != len(queries):
                raise RuntimeError(f"encoder returned {len(rows)} rows for {len(queries)} queries")
        except BaseException as exc:  # every caller of this batch sees the failure
            for r in requests:
                r.future.set_exception(exc)
            return
        start = 0
        for r in requests:
            r.future.set_result(rows[start:start + len(r.queries)])
            start += len(r.queries)

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and item.future.set_running_or_notify_cancel():
                item.future.set_exception(RuntimeError("the query batcher is closed"))

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the collector after the batch it is running (waits up to ``timeout_s``; 0 from a
        finaliser: only tells it to stop)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        if timeout_s > 0:
            self._thread.join(timeout_s)
