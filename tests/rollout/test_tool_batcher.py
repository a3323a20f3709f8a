"""`rollout/tool_batcher.py`: concurrent coroutines' tool calls leave in shared batches, each gets
its own results, a batch's failure reaches only that batch's callers, never more than `width`
batches are out, and no call waits while fewer than `width` are out. (The real path, verl's worker with the batcher on, is in
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
        self.lock, self.out, self.most_out = threading.Lock(), 0, 0

    def __call__(self, calls: list) -> list:
        with self.lock:
            self.batches.append(list(calls))
            self.threads.add(threading.get_ident())
            self.out += 1
            self.most_out = max(self.most_out, self.out)
        try:
            time.sleep(self.seconds)
        finally:
            with self.lock:
                self.out -= 1
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


def test_with_room_for_two_batches_a_call_goes_at_once_and_the_rest_wait_for_a_free_one():
    tools = SlowTools(0.3)

    async def main():
        batcher = ToolBatcher(tools, width=2)
        started = time.perf_counter()
        first = asyncio.create_task(batcher.execute(["a"]))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(batcher.execute(["b"]))  # one batch out: room for this one
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(batcher.execute([f"c{k}"])) for k in range(4)]  # two out: they wait
        second_done = await second
        second_s = time.perf_counter() - started
        return await first, second_done, second_s, await asyncio.gather(*rest), batcher

    first, second, second_s, rest, batcher = asyncio.run(main())
    assert first == ["result of a"] and second == ["result of b"]
    assert rest == [[f"result of c{k}"] for k in range(4)]
    assert batcher.batches == [1, 1, 4] == [len(batch) for batch in tools.batches]
    assert second_s < 0.3 + 0.05 + 0.2  # "b" did not wait for "a" (that would be past 0.6 s)
    assert tools.most_out == 2


def test_calls_of_one_turn_of_the_loop_share_a_batch_and_no_more_than_width_are_ever_out():
    tools = SlowTools(0.05)

    async def main():
        batcher = ToolBatcher(tools, width=3)
        same_turn = await asyncio.gather(*[batcher.execute([f"s{k}"]) for k in range(5)])

        async def trajectory(k: int):  # calls staggered over time: batches of one while room lasts
            for turn in range(4):
                await asyncio.sleep(0.01 * ((k + turn) % 3))
                assert await batcher.execute([f"t{k}.{turn}"]) == [f"result of t{k}.{turn}"]

        await asyncio.gather(*[trajectory(k) for k in range(12)])
        return same_turn, batcher

    same_turn, batcher = asyncio.run(main())
    assert same_turn == [[f"result of s{k}"] for k in range(5)]
    assert batcher.batches[0] == 5  # made in one turn of the loop: one batch
    assert sum(batcher.batches) == 5 + 12 * 4
    assert tools.most_out <= 3 and tools.most_out >= 2  # room used, never exceeded
    assert max(batcher.batches[1:]) > 1  # under load, waiting calls merged


def test_a_width_below_one_is_refused():
    with pytest.raises(ValueError, match="width >= 1"):
        ToolBatcher(SlowTools(0.0), width=0)


def test_a_batch_with_the_wrong_number_of_results_fails_its_callers_instead_of_misaligning_them():
    def short(calls: list) -> list:
        return [f"result of {call}" for call in calls[:-1]]  # a bug: one result lost

    async def main():
        batcher = ToolBatcher(short, width=1)
        return await asyncio.gather(batcher.execute(["a"]), batcher.execute(["b", "c"]), return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and "3 calls returned 2 results" in str(r) for r in results), results


def test_the_calls_of_a_caller_cancelled_before_its_batch_left_are_not_sent():
    tools = SlowTools(0.2)

    async def main():
        batcher = ToolBatcher(tools, width=1)
        first = asyncio.create_task(batcher.execute(["a"]))
        await asyncio.sleep(0.05)  # "a" is out: the next two wait
        gone = asyncio.create_task(batcher.execute(["gone"]))
        kept = asyncio.create_task(batcher.execute(["kept"]))
        await asyncio.sleep(0.01)
        gone.cancel()
        return await first, await kept, gone.cancelled()

    first, kept, cancelled = asyncio.run(main())
    assert first == ["result of a"] and kept == ["result of kept"] and cancelled
    assert tools.batches == [["a"], ["kept"]]
