"""The rollout schedules. Each drives the one per-sample step (`step.py`) through the rollout's
episode driver (`driver.py`), so what an episode contains never depends on the schedule; the
engine is handed to the schedule beside the driver.

- `run_turn_synchronized`: every turn, one generate call for all active samples, then one
  retriever request per tool kind. A turn waits for its slowest sample and its slowest call.
- `run_continuous`: each sample's next turn goes to the engine as soon as its own observation is
  ready (vLLM continuous batching, `add_request`/`step`). The tool calls that finish in one engine
  step go out as one small retriever batch at once, with up to `retriever_max_concurrency`
  batches out together, so no sample waits for another's retrieval; on a single rank the pages
  are decoded in the tool threads, off the engine loop. The engine steps whenever a request is
  in it; the loop blocks on the retriever only when nothing else can run.
- `run_episode`: one sample as a coroutine, for trainers that run an agent loop per trajectory
  (verl: `integrations/verl`); the engine is theirs, behind an awaitable `generate`.

Invariants: per-sample seeds and the shared step make the episodes of both schedules identical
(timing decides when a turn runs, never what it samples or observes); the continuous loop ends
only when every sample has ended and no retriever batch is out; if anything raises, every
request still in the engine is aborted before the error propagates; request ids are unique in
the process, and a run first aborts what an earlier one left (`engine.ContinuousEngine`), so no
request or output can leak into the next call. Under tensor
parallelism only the sync's source rank calls the retriever and decides which batches are back
before each engine step; every rank applies that decision (`group_sync.py`).

Threads (docs/concurrency.md): the calling thread owns the engine and every episode. A tool
thread gets a batch's calls and the budget and image slots of each episode, read when the batch
went out, reads nothing else of an episode (its `doc_id` and `index` never change) and returns
values; the loop applies them. Every wait for a tool batch has a deadline: the retriever's own
(`driver.tool_deadline_s`), past which the call fails with `TimeoutError` (checked whenever the
loop would block on the batch).

The driver is an `EpisodeDriver` (`driver.py`); what the schedules need of it is the `Driver`
protocol below. `ScheduleClock` collects where the time went, for the batch's metrics.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Protocol, TypeVar

from ..engine.llm import ContinuousEngine, VLLMEngine
from ..progress import report
from ..turn_output import TurnOutput
from ..core.episode import Episode

T = TypeVar("T")


class Driver(Protocol):
    """What a schedule needs of the driver it runs: the sync it uses, and the hooks of one
    sample's turn (each delegating to the shared step, `core.step`)."""

    sync: Any  # engine.group_sync.LocalSync or GroupSync
    max_turns: int
    tool_deadline_s: Optional[float]  # the bound on one batch of tool calls (None: the retriever's own)

    def ready(self, episode: Episode) -> bool:
        """Whether the sample generates again."""

    def request(self, episode: Episode, turn: int) -> tuple[dict, Any]:
        """The engine prompt and sampling parameters of the sample's next turn."""

    def after_generation(self, episode: Episode, output: TurnOutput, turn: int) -> Any:
        """Append the turn and settle it; the action when it needs the retriever, else None."""

    def room(self, calls: list) -> list[tuple[int, int]]:
        """(budget, image slots) of each call's episode, read when the calls go out."""

    def execute_tools(self, calls: list) -> list:
        """Observations for a batch of calls, on the calling thread (within `tool_deadline_s`)."""

    def tool_outcomes(self, calls: list) -> list:
        """The retriever's outcomes for a batch of calls (pure I/O; any thread)."""

    def observe_outcomes(self, calls: list, outcomes: list, room: list) -> list:
        """Observations for the outcomes within `room` (reads no episode; any thread)."""

    def apply_tools(self, calls: list, results: list) -> None:
        """Append each call's observation to its episode (the loop thread only)."""


@dataclass
class ScheduleClock:
    """Seconds of one rollout call: in the engine, blocked on the retriever, and sample-seconds
    spent waiting for tool results (summed over samples, so it can exceed the wall time)."""

    started: float = field(default_factory=time.perf_counter)
    engine: float = 0.0
    blocked_on_tools: float = 0.0
    sample_tool_wait: float = 0.0

    def metrics(self) -> dict[str, float]:
        wall = time.perf_counter() - self.started
        overhead = max(0.0, wall - self.engine - self.blocked_on_tools)
        return {
            "rollout/engine_seconds": self.engine,
            "rollout/engine_busy_share": self.engine / wall if wall > 0 else 0.0,
            "rollout/blocked_on_retriever_seconds": self.blocked_on_tools,
            "rollout/sample_retriever_wait_seconds": self.sample_tool_wait,
            # Time outside engine calls and retriever waits: the loop's own CPU work.
            "rollout/loop_overhead_seconds": overhead,
            "rollout/loop_overhead_share_of_engine": overhead / self.engine if self.engine > 0 else 0.0,
        }


async def run_episode(driver: Driver, episode: Episode, generate: Callable[[dict, Any], Awaitable[TurnOutput]],
                      clock: ScheduleClock, tools: Optional[Callable[[list], Awaitable[list]]] = None) -> None:
    """One sample on its own coroutine (an agent loop: verl runs one per trajectory), through the
    same hooks as the batch schedules: `generate(request, params)` is awaited for each turn, and
    the turn's tool call runs off the event loop within the driver's deadline, so other
    trajectories' coroutines go on meanwhile: through `tools` (e.g. a `tool_batcher.ToolBatcher`
    merging concurrent trajectories' calls), else in a worker thread of its own."""
    for turn in range(driver.max_turns):
        if not driver.ready(episode):
            break
        request, params = driver.request(episode, turn)
        started = time.perf_counter()
        output = await generate(request, params)
        clock.engine += time.perf_counter() - started
        action = driver.after_generation(episode, output, turn)
        if action is None:
            continue
        calls = [(episode, action)]
        started = time.perf_counter()
        results = await (tools(calls) if tools is not None else asyncio.to_thread(driver.execute_tools, calls))
        clock.sample_tool_wait += time.perf_counter() - started
        driver.apply_tools(calls, results)


def run_turn_synchronized(driver: Driver, engine: VLLMEngine, episodes: list[Episode], clock: ScheduleClock) -> None:
    for turn in range(driver.max_turns):
        active = [ep for ep in episodes if driver.ready(ep)]
        if not active:
            break
        report("turn %d of at most %d: %d of %d episodes still acting", turn + 1, driver.max_turns, len(active),
               len(episodes))
        requests = [driver.request(ep, turn) for ep in active]
        started = time.perf_counter()
        outputs = engine.generate([r[0] for r in requests], [r[1] for r in requests])
        clock.engine += time.perf_counter() - started
        calls = [(ep, action) for ep, output in zip(active, outputs)
                 if (action := driver.after_generation(ep, output, turn)) is not None]
        if calls:
            started = time.perf_counter()
            results = driver.execute_tools(calls)  # within driver.tool_deadline_s
            waited = time.perf_counter() - started
            clock.blocked_on_tools += waited
            clock.sample_tool_wait += waited * len(calls)
            driver.apply_tools(calls, results)


@dataclass
class _Batch:
    calls: list  # (episode, action)
    room: list  # (budget, image slots) of each call's episode when the batch went out
    future: Optional[Future]  # on the source rank; None elsewhere
    sent: float


def run_continuous(driver: Driver, llm: Any, episodes: list[Episode], clock: ScheduleClock, max_inflight: int) -> None:
    """The continuous schedule (module docstring) on `llm`, a `vllm.LLM`."""
    engine = ContinuousEngine(llm)
    turns = {ep.index: 0 for ep in episodes}
    # On one rank the tool thread decodes the pages too; across ranks every rank decodes the
    # source's broadcast outcomes itself (decoding is deterministic, thread timing is not).
    local = getattr(driver.sync, "is_local", False)
    deadline_s = driver.tool_deadline_s

    def submit(episode: Episode) -> None:
        if driver.ready(episode):
            prompt, params = driver.request(episode, turns[episode.index])
            started = time.perf_counter()
            # vLLM processes the request's inputs (its images included) here: engine work, as
            # inside LLM.generate for the synchronized schedule.
            engine.submit(f"{episode.index}-{turns[episode.index]}", prompt, params, episode)
            clock.engine += time.perf_counter() - started

    def tool_work(calls: list, room: list) -> Any:
        outcomes = driver.tool_outcomes(calls)
        return driver.observe_outcomes(calls, outcomes, room) if local else outcomes

    def returned(inflight: list[_Batch], block: bool) -> list:
        """(batch index, result) of the batches back now; with `block`, at least one."""
        if block:
            await_one([b.future for b in inflight], [b.sent for b in inflight], deadline_s)
        return [(k, b.future.result()) for k, b in enumerate(inflight) if b.future.done()]

    waiting: list = []
    inflight: list[_Batch] = []
    ended = 0
    tools = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="tools")
    failed = True
    try:
        for episode in episodes:
            submit(episode)
        while engine.busy or waiting or inflight:
            if engine.busy:
                started = time.perf_counter()
                finished = engine.step()
                clock.engine += time.perf_counter() - started
            else:
                finished = []
            for episode, output in finished:
                action = driver.after_generation(episode, output, turns[episode.index])
                if action is not None:
                    waiting.append((episode, action))
                elif not episode.done:  # corrected an invalid action: on to the next turn
                    turns[episode.index] += 1
                    submit(episode)
                if episode.done:
                    ended += 1
                    report_ended(ended, episodes, episode)
            if inflight:
                # Nothing can run until a batch is back: the engine is empty and no new batch
                # can go out. Then (and only then) the loop blocks on the retriever.
                block = not engine.busy and (not waiting or len(inflight) >= max_inflight)
                started = time.perf_counter()
                back = driver.sync.share(lambda: returned(inflight, block))
                if block:
                    clock.blocked_on_tools += time.perf_counter() - started
                now = time.perf_counter()
                done = {k: result for k, result in back}
                finished_batches = [(inflight[k], done[k]) for k in sorted(done)]
                inflight = [b for k, b in enumerate(inflight) if k not in done]
                for batch, result in finished_batches:
                    clock.sample_tool_wait += (now - batch.sent) * len(batch.calls)
                    results = result if local else driver.observe_outcomes(batch.calls, result, batch.room)
                    driver.apply_tools(batch.calls, results)
                    for episode, _ in batch.calls:
                        turns[episode.index] += 1
                        submit(episode)
                        if episode.done:  # ended by its observation (the budget)
                            ended += 1
                            report_ended(ended, episodes, episode)
            if waiting and len(inflight) < max_inflight:
                calls, waiting = waiting, []
                room = driver.room(calls)
                future = tools.submit(tool_work, calls, room) if driver.sync.is_source else None
                inflight.append(_Batch(calls, room, future, time.perf_counter()))
        failed = False
    except BaseException:
        engine.abort_all()
        raise
    finally:
        # After an error a tool thread may still be waiting on the retriever: leave it (it
        # returns values only and touches no episode) rather than wait for it here.
        tools.shutdown(wait=not failed, cancel_futures=True)


def report_ended(ended: int, episodes: list[Episode], episode: Episode) -> None:
    """A progress line for an episode that ended: each one in a small batch, else each quarter."""
    total = len(episodes)
    if total <= 8 or ended == total or ended * 4 // total > (ended - 1) * 4 // total:
        report("episode %d of %d ended (%s, %d turns)", ended, total, episode.termination, episode.turns)


def call_within(compute: Callable[[], T], deadline_s: Optional[float]) -> T:
    """`compute()`, or TimeoutError when it has not returned within `deadline_s` (None: no
    bound of our own). It runs on a daemon thread, which a call stuck for good leaves behind."""
    if deadline_s is None:
        return compute()
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(compute())
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            future.set_exception(error)

    threading.Thread(target=run, name="tools", daemon=True).start()
    await_one([future], [time.perf_counter()], deadline_s)
    return future.result()


def await_one(futures: list[Future], sent: list[float], deadline_s: Optional[float]) -> None:
    """Wait until one of `futures` is done; TimeoutError when none is by the deadline of the
    oldest (`deadline_s` after it was sent; None: the retriever bounds its own calls)."""
    timeout = None if deadline_s is None else max(0.0, min(sent) + deadline_s - time.perf_counter())
    done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
    if not done:
        raise TimeoutError(f"a retriever batch was not back within its deadline of {deadline_s:.1f} s")
