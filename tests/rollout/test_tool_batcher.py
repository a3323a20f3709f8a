"""`rollout/tool_batcher.py`: concurrent coroutines' tool calls leave in shared batches, each gets
its own results, a batch's failure reaches only that batch's callers, and no call waits while no
batch is out. (The real path, verl's worker with the batcher on, is in
tests/integrations/test_verl_agent_loop.py: its episodes equal the EasyR1 rollout's.)"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from vrag_rollout.rollout.tool_batcher import ToolBatcher, for_loop


class SlowTools:
    """execute_tools stand-in: each call's result names it; a batch takes `seconds`; a call named
    "boom" makes its whole batch raise."""

    def __init__(self, seconds: float):
        self.seconds, self.batches, self.threads = seconds, [], set()

    def __call__(self, calls: list) -> list:
        self.batches.append(list(calls))
        self.threads.add(threading.get_ident())
        time.sleep(self.seconds)
        if "boom" in calls:
            raise TimeoutError("the retriever batch passed its deadline")
        return [f"result of {call}" for call in calls]


def test_calls_arriving_while_a_batch_is_out_leave_together_and_get_their_own_results():
    tools = SlowTools(0.2)

    async def main():
        batcher = ToolBatcher(tools)
        first = asyncio.create_task(batcher.execute(["a"]))
        await asyncio.sleep(0.05)  # "a" is out: the next ones wait for it, then go as one batch
        rest = [asyncio.create_task(batcher.execute([f"c{k}", f"d{k}"])) for k in range(5)]
        return await first, await asyncio.gather(*rest), batcher

    first, rest, batcher = asyncio.run(main())
    assert first == ["result of a"]
    assert rest == [[f"result of c{k}", f"result of d{k}"] for k in range(5)]
    assert [len(batch) for batch in tools.batches] == [1, 10] == batcher.batches
    assert threading.get_ident() not in tools.threads  # off the event loop


def test_a_failed_batch_fails_its_callers_only():
    tools = SlowTools(0.1)

    async def main():
        batcher = ToolBatcher(tools)
        first = asyncio.create_task(batcher.execute(["ok1"]))
        await asyncio.sleep(0.02)
        doomed = [asyncio.create_task(batcher.execute(["boom"])), asyncio.create_task(batcher.execute(["x"]))]
        results = await asyncio.gather(*doomed, return_exceptions=True)
        later = await batcher.execute(["ok2"])  # the batcher goes on after a failure
        return await first, results, later

    first, results, later = asyncio.run(main())
    assert first == ["result of ok1"] and later == ["result of ok2"]
    assert all(isinstance(r, TimeoutError) for r in results)


def test_a_lone_call_goes_at_once_and_each_loop_has_its_own_batcher():
    tools = SlowTools(0.0)

    async def main():
        started = time.perf_counter()
        batcher = for_loop("rollout", tools)
        result = await batcher.execute(["solo"])
        assert for_loop("rollout", tools) is batcher
        return result, time.perf_counter() - started, batcher

    result, seconds, one = asyncio.run(main())
    assert result == ["result of solo"] and seconds < 0.5
    _, _, other = asyncio.run(main())
    assert other is not one
