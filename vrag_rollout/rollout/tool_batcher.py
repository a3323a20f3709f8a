"""Merging concurrent trajectories' tool calls into shared retriever batches (agent loops).

Under a trainer that runs one coroutine per trajectory (verl's agent loops), each episode's tool
call would be its own retriever request: batches of one. `ToolBatcher` gathers the calls that
arrive while a batch is out and sends them together as the next batch, through the rollout's own
`execute_tools` (one search request and one fetch request for the whole batch), in a worker thread:

- a call that finds no batch out goes at once (no added latency when the load is light);
- calls that arrive while one is out wait for it, then leave together (batches grow with load);
- each call gets exactly the results of its own calls, in order; an exception of a batch (a
  deadline passed, a bug) reaches every call of that batch and no other.

One batcher per event loop (`for_loop`): a batch's futures belong to the loop that awaits them.
The worker thread reads the batch's episodes (their budget and image room): each one's coroutine
is suspended on its call, so nothing writes them meanwhile.
Invariant: at most one batch is out per batcher, and no call waits while none is out.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any, Callable, Sequence

_batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()
_batchers_lock = threading.Lock()


class ToolBatcher:
    def __init__(self, execute: Callable[[list], list]):
        self._execute = execute  # blocking: (episode, action) calls -> one result each
        self._waiting: list[tuple[list, asyncio.Future]] = []
        self._busy = False
        self.batches: list[int] = []  # calls per batch sent, for metrics and tests

    async def execute(self, calls: Sequence[Any]) -> list:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((list(calls), future))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                merged = [call for calls, _ in batch for call in calls]
                self.batches.append(len(merged))
                try:
                    results = await asyncio.to_thread(self._execute, merged)
                except BaseException as error:  # noqa: BLE001 - handed to every caller of this batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                start = 0
                for calls, future in batch:
                    if not future.done():
                        future.set_result(results[start:start + len(calls)])
                    start += len(calls)
        finally:
            self._busy = False


def for_loop(key: Any, execute: Callable[[list], list]) -> ToolBatcher:
    """The batcher of the running event loop for `key` (e.g. a shared rollout), made on first use."""
    loop = asyncio.get_running_loop()
    with _batchers_lock:
        per_loop = _batchers.setdefault(loop, {})
        if key not in per_loop:
            per_loop[key] = ToolBatcher(execute)
        return per_loop[key]
