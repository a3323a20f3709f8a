"""Merging concurrent trajectories' tool calls into shared retriever batches (agent loops).

Under a trainer that runs one coroutine per trajectory (verl's agent loops), each episode's tool
call would be its own retriever request: batches of one. `ToolBatcher` sends calls as batches
through the rollout's own `execute_tools` (one search request and one fetch request for the whole
batch), in worker threads, with up to `width` batches out at once (the rollout's
`retriever_max_concurrency`, as the continuous schedule keeps its tool batches):

- a call that finds fewer than `width` batches out goes at once, with the calls that arrived in
  the same turn of the event loop (no added latency while the retriever has room);
- calls that arrive while `width` batches are out wait for one to return, then leave together
  (batches grow with load, and the retriever sees no more requests than it has room for);
- each call gets exactly the results of its own calls, in order; an exception of a batch (a
  deadline passed, a bug, a result count that does not match the calls) reaches every call of
  that batch and no other; the calls of a caller cancelled before its batch left are not sent.

One batcher per event loop (`for_loop`): a batch's futures belong to the loop that awaits them,
and all its bookkeeping runs on that loop's thread. The worker threads read their batch's
episodes (budget and image room): each one's coroutine is suspended on its call, so nothing
writes them meanwhile.
Invariant: at most `width` batches are out per batcher, and no call waits past the current turn
of the event loop while fewer than `width` are out.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any, Callable, Sequence

_batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()
_batchers_lock = threading.Lock()


class ToolBatcher:
    def __init__(self, execute: Callable[[list], list], width: int = 1):
        if int(width) < 1:
            raise ValueError(f"a tool batcher needs width >= 1 (batches out at once), got {width!r}")
        self._execute = execute  # blocking: (episode, action) calls -> one result each
        self._width = int(width)
        self._waiting: list[tuple[list, asyncio.Future]] = []
        self._out: set[asyncio.Task] = set()  # batches out (the loop keeps only weak task references)
        self._send_due = False  # a `_send` is scheduled for this turn of the loop
        self.batches: list[int] = []  # calls per batch sent, for metrics and tests

    async def execute(self, calls: Sequence[Any]) -> list:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((list(calls), future))
        self._schedule_send()
        return await future

    def _schedule_send(self) -> None:
        # Sent at the end of this turn of the loop, so calls made in the same turn share a batch.
        if self._waiting and len(self._out) < self._width and not self._send_due:
            self._send_due = True
            asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._send_due = False
        if not self._waiting or len(self._out) >= self._width:
            return
        batch = [(calls, future) for calls, future in self._waiting if not future.cancelled()]  # caller gone
        self._waiting = []
        if not batch:
            return
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._out.add(task)
        task.add_done_callback(self._returned)

    def _returned(self, task: asyncio.Task) -> None:
        self._out.discard(task)
        self._schedule_send()

    async def _run(self, batch: list[tuple[list, asyncio.Future]]) -> None:
        merged = [call for calls, _ in batch for call in calls]
        self.batches.append(len(merged))
        try:
            results = list(await asyncio.to_thread(self._execute, merged))
            if len(results) != len(merged):
                raise RuntimeError(f"a tool batch of {len(merged)} calls returned {len(results)} results")
        except asyncio.CancelledError:  # the loop is shutting down: the callers are cancelled too
            for _, future in batch:
                future.cancel()
            raise
        except BaseException as error:  # noqa: BLE001 - handed to every caller of this batch
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        start = 0
        for calls, future in batch:
            if not future.done():
                future.set_result(results[start:start + len(calls)])
            start += len(calls)


def for_loop(key: Any, execute: Callable[[list], list], width: int = 1) -> ToolBatcher:
    """The batcher of the running event loop for `key` (e.g. a shared rollout), made on first use
    (with `width`: batches out at once)."""
    loop = asyncio.get_running_loop()
    with _batchers_lock:
        per_loop = _batchers.setdefault(loop, {})
        if key not in per_loop:
            per_loop[key] = ToolBatcher(execute, width)
        return per_loop[key]
