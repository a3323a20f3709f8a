"""Page preprocessing in worker processes, pipelined with the model.

Contract: ``PreparePool(init, init_args, prepare, workers=N)`` starts N worker processes (lazily,
on first use); each runs ``init(*init_args)`` once (e.g. loads the processor, never the model),
then ``prepare(batch) -> inputs`` for each batch it is given. ``imap(batches)`` yields each
batch's inputs in input order while keeping up to ``depth`` batches in flight, so while the
caller runs the model on batch k the workers prepare batches k+1..k+depth.

Invariants:
- What ``imap`` yields is exactly what ``prepare`` returned in the worker (pickled across; torch
  tensors travel through shared memory, as in a DataLoader), in input order.
- Every wait has a deadline (``timeout_s`` per batch); a dead worker fails the call with
  ``BrokenProcessPool`` and the next call starts fresh workers.
- A caller that stops early (an exception in its model step) cancels the batches not yet started.
- ``close()`` stops and joins the workers; later calls raise ``RuntimeError``.

Processes, not threads: the image processor is Python and numpy code that holds the GIL, so
threads cannot keep a GPU fed; worker processes each have their own interpreter.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

ENV_WORKERS = "VRAG_ENCODER_PREP_WORKERS"
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """``$VRAG_ENCODER_PREP_WORKERS`` if set, else one core left for the model's own thread."""
    value = os.environ.get(ENV_WORKERS, "").strip()
    if value:
        return max(0, int(value))
    return max(1, min((os.cpu_count() or 2) - 1, MAX_DEFAULT_WORKERS))


def _context(preload: tuple[str, ...]):
    # Never fork the caller: it holds threads (server, torch) and maybe a CUDA context. A
    # forkserver imports the heavy modules once and forks cheap workers from that clean process.
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))  # no effect if the forkserver already runs
        return ctx
    return multiprocessing.get_context("spawn")


class PreparePool:
    def __init__(self, init: Callable, init_args: tuple, prepare: Callable, *, workers: int,
                 depth: int | None = None, timeout_s: float = 600.0,
                 preload: tuple[str, ...] = ()):
        if workers < 1:
            raise ValueError("PreparePool needs at least one worker")
        self.workers = workers
        # Enough batches queued that no worker idles while the model runs one batch.
        self.depth = depth or 2 * workers
        self.timeout_s = timeout_s
        self._init, self._init_args, self._prepare = init, init_args, prepare
        self._preload = preload
        self._lock = threading.Lock()  # guards _executor and _closed
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the encoder's preprocessing workers are closed")
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers, mp_context=_context(self._preload),
                    initializer=self._init, initargs=self._init_args)
                # The executor starts workers one per waiting task: start them all now.
                for _ in range(self.workers):
                    self._executor.submit(os.getpid)
            return self._executor

    def start(self) -> list[int]:
        """Start the workers now (else the first ``imap`` does) and wait until they are ready."""
        pool = self._pool()
        for future in [pool.submit(os.getpid) for _ in range(self.workers)]:
            future.result(timeout=self.timeout_s)
        return self.pids()

    def _drop_broken(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is pool:
                self._executor = None
        pool.shutdown(wait=False, cancel_futures=True)

    def imap(self, batches: Iterable) -> Iterator:
        """Each batch's prepared inputs, in order, with up to ``depth`` batches in flight."""
        pool = self._pool()
        todo = iter(batches)
        pending: deque[Future] = deque()

        def submit_next() -> None:
            for batch in todo:
                pending.append(pool.submit(self._prepare, batch))
                return

        try:
            for _ in range(self.depth):
                submit_next()
            while pending:
                inputs = pending.popleft().result(timeout=self.timeout_s)
                submit_next()  # refill before handing back, so workers run during the model step
                yield inputs
        except BrokenProcessPool:
            self._drop_broken(pool)
            raise
        finally:
            for future in pending:  # the caller stopped early or failed: drop queued work
                future.cancel()

    def pids(self) -> list[int]:
        """The worker processes' ids (for tests and diagnostics)."""
        with self._lock:
            processes = getattr(self._executor, "_processes", None) or {}
            return list(processes)

    def close(self, timeout_s: float = 30.0, wait: bool = True) -> None:
        """Stop the workers and wait (up to ``timeout_s``) for them to exit; idempotent.

        A worker still busy past the deadline is terminated rather than waited on. With
        ``wait=False`` (from a finaliser) the workers are told to exit and nothing waits.
        """
        with self._lock:
            self._closed = True
            pool, self._executor = self._executor, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(5.0)
        pool.shutdown(wait=True)  # the workers are gone: this only joins the manager thread
