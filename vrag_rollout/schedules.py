"""The two rollout schedules. Both drive the one per-sample step (`step.py`) through the rollout
that runs them, so what an episode contains never depends on the schedule.

- `run_turn_synchronized`: every turn, one generate call for all active samples, then one
  retriever request per tool kind. A turn waits for its slowest sample and its slowest call.
- `run_continuous`: each sample's next turn goes to the engine as soon as its own observation is
  ready (vLLM continuous batching, `add_request`/`step`). The tool calls that finish in one engine
  step go out as one small retriever batch at once, with up to `retriever_max_concurrency`
  batches out together, so no sample waits for another's retrieval; on a single rank the pages
  are decoded in the tool threads, off the engine loop. The engine steps whenever a request is
  in it; the loop blocks on the retriever only when nothing else can run.

Invariants: per-sample seeds and the shared step make the episodes of both schedules identical
(timing decides when a turn runs, never what it samples or observes); the continuous loop ends
only when every sample has ended and no retriever batch is out; if anything raises, every
request still in the engine is aborted before the error propagates, and request ids carry the
rollout call's number, so none can leak into the next call. Under tensor parallelism only the
sync's source rank calls the retriever and decides which batches are back before each engine
step; every rank applies that decision (`group_sync.py`).

The driver is the rollout (`rollout.vLLMRollout`): the schedules call its per-turn hooks
(`_ready`, `_request`, `_after_generation`, `_execute_tools`, `_tool_outcomes`,
`_observe_outcomes`, `_apply_tools`) and read `sync`, `engine`, `inference_engine`, `max_turns`.
`ScheduleClock` collects where the time went, for the batch's metrics.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Optional

from .engine import ContinuousEngine
from .episode import Episode


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


def run_turn_synchronized(driver: Any, episodes: list[Episode], clock: ScheduleClock) -> None:
    for turn in range(driver.max_turns):
        active = [ep for ep in episodes if driver._ready(ep)]
        if not active:
            break
        requests = [driver._request(ep, turn) for ep in active]
        started = time.perf_counter()
        outputs = driver.engine.generate([r[0] for r in requests], [r[1] for r in requests])
        clock.engine += time.perf_counter() - started
        calls = [(ep, action) for ep, output in zip(active, outputs)
                 if (action := driver._after_generation(ep, output, turn)) is not None]
        if calls:
            started = time.perf_counter()
            results = driver._execute_tools(calls)
            waited = time.perf_counter() - started
            clock.blocked_on_tools += waited
            clock.sample_tool_wait += waited * len(calls)
            driver._apply_tools(calls, results)


@dataclass
class _Batch:
    calls: list  # (episode, action)
    future: Optional[Future]  # on the source rank; None elsewhere
    sent: float


def run_continuous(driver: Any, episodes: list[Episode], clock: ScheduleClock, max_inflight: int) -> None:
    engine = ContinuousEngine(driver.inference_engine)
    turns = {ep.index: 0 for ep in episodes}
    # On one rank the tool thread decodes the pages too; across ranks every rank decodes the
    # source's broadcast outcomes itself (decoding is deterministic, thread timing is not).
    local = getattr(driver.sync, "is_local", False)

    def submit(episode: Episode) -> None:
        if driver._ready(episode):
            prompt, params = driver._request(episode, turns[episode.index])
            started = time.perf_counter()
            # vLLM processes the request's inputs (its images included) here: engine work, as
            # inside LLM.generate for the synchronized schedule.
            engine.submit(f"{driver._step}-{episode.index}-{turns[episode.index]}", prompt, params, episode)
            clock.engine += time.perf_counter() - started

    def tool_work(calls: list) -> Any:
        outcomes = driver._tool_outcomes(calls)
        return driver._observe_outcomes(calls, outcomes) if local else outcomes

    def returned(inflight: list[_Batch], block: bool) -> list:
        """(batch index, result) of the batches back now; with `block`, at least one."""
        if block:
            wait([b.future for b in inflight], return_when=FIRST_COMPLETED)
        return [(k, b.future.result()) for k, b in enumerate(inflight) if b.future.done()]

    for episode in episodes:
        submit(episode)
    waiting: list = []
    inflight: list[_Batch] = []
    tools = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="tools")
    try:
        while engine.busy or waiting or inflight:
            if engine.busy:
                started = time.perf_counter()
                finished = engine.step()
                clock.engine += time.perf_counter() - started
            else:
                finished = []
            for episode, output in finished:
                action = driver._after_generation(episode, output, turns[episode.index])
                if action is not None:
                    waiting.append((episode, action))
                elif not episode.done:  # corrected an invalid action: on to the next turn
                    turns[episode.index] += 1
                    submit(episode)
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
                    results = result if local else driver._observe_outcomes(batch.calls, result)
                    driver._apply_tools(batch.calls, results)
                    for episode, _ in batch.calls:
                        turns[episode.index] += 1
                        submit(episode)
            if waiting and len(inflight) < max_inflight:
                calls, waiting = waiting, []
                future = tools.submit(tool_work, calls) if driver.sync.is_source else None
                inflight.append(_Batch(calls, future, time.perf_counter()))
    except BaseException:
        engine.abort_all()
        raise
    finally:
        tools.shutdown(wait=True, cancel_futures=True)
