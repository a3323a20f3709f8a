"""Peer benchmark: `vrag_agent` against verl's own `tool_agent` loop, side by side, in one run.

Both loops run inside verl 0.9.1's own `AgentLoopWorker` (built without Ray,
`integrations.verl.local.local_worker`), on the same questions, the same engine and tiny model,
the same retriever behind the same injected latency and the same per-request seeds:

- (a) `vrag_agent` (`integrations.verl.agent_loop.VragAgentLoop`) in the native tool-call format;
- (b) verl's `tool_agent` (`verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop`, hermes
  parser) with `integrations.verl.peer_tools.SearchTool`/`FetchTool`: the same two tool schemas,
  the same `RetrieverClient`, pages resized into the same pixel band.

The engine is one vLLM `AsyncLLM` (`engine.stand_ins.async_token_server.AsyncTokenServer`, built with the
engine arguments of `engine.llm.build_llm`) answering as verl's vLLM server does, so concurrent
trajectories are continuously batched as in verl. The workload is scripts/bench_schedules.py's
long tail: each sample (by its row index) gets a number of turns from 1 to --max-turns (most
short, a few long, `planned_turns`) and a think length per turn, which a per-sample grammar makes
the random tiny model follow: one tool call (`search` or `fetch`, as the chat template writes
it) per turn until its last, then an answer. The retriever is `LatentRetriever` (recorded
answers after 100-400 ms), serving any number of requests at once, or `--retriever-slots` at once
(the project's server admits 2 by default; `--retriever-concurrency` sets both loops' clients). The grammar, the per-(sample, turn) seed (`request_seed`, which
`vrag_agent` sets itself; verl's loop sends none, so it is added) and a ban of the second EOS
`<|endoftext|>` (a turn ends with the chat template's `<|im_end|>`) are applied per request by
the harness's server wrapper, identically for both loops; the server also masks the vision
placeholders, as verl's server does. Each loop's trajectory finds its sample number through a
context variable set by a wrapper of the worker's `_run_agent_loop`.

Printed per loop: wall time (median over --repeats, after --warmup untimed passes of each loop;
the loops alternate which goes first; this CPU is shared, so single walls vary) and the
ratio; CPU seconds outside the engine per turn (this process's CPU time minus the CPU of vLLM's
frontend in this process, which the server measures, over the turns; the engine core runs in
vLLM's own process, whose CPU is printed apart); retriever calls and their batch sizes; turns,
termination and how many turns sampled the same tokens in both loops; and what the project's
`check` (`verify.check.check_batch` on `verify.saved_batch.from_dataproto`) finds in each loop's
DataProto. verl's `_postprocess` keeps no images, so the harness copies each trajectory's
`multi_modal_data` into its `extra_fields` (our loop already does) for `check` to read, and
tells `check` the batch is in the tool-call format (our loop records it in `rollout_meta`).

Also printed, per loop, its critical path: the trajectory that spent longest awaiting the engine
and its tool results, and those two times. Wall divided by their sum bounds what removing the
loop's own time (outside those awaits) could gain, the awaits held as they were. They are not
fixed under every loop (the engine is shared with the other trajectories and with the loop's
CPU), so a floor follows: each of tool_agent's trajectories replayed alone on the engine, turn by
turn with the same requests, plus the retriever's least latency per call; the longest of these
is a time no loop on this engine and retriever can beat.

Targets: vrag_agent at least 1.3x faster than tool_agent; zero check failures for vrag_agent
(verl's are reported as found).

    .venv/bin/python scripts/bench_verl.py [--prompts 8] [--n 2] [--max-turns 4] [--repeats 3] [--warmup 1]
        [--retriever-slots 0] [--retriever-concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import dataclasses
import io
import random
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

TARGET_SPEEDUP = 1.3
LOOPS = ("vrag_agent", "tool_agent")
SAMPLE = contextvars.ContextVar("bench_sample", default=None)  # the trajectory's row number


class RecordingTransport:
    """The latent retriever, its RNG re-seeded per run, recording each request's batch size."""

    def __init__(self, latent: Any):
        self.latent, self.sizes = latent, Counter()

    def reset(self, seed: int) -> None:
        self.latent.rng, self.sizes = random.Random(seed), Counter()

    def post(self, path, body, timeout):
        self.sizes[(path.strip("/"), len(body.get("query") or ()))] += 1
        return self.latent.post(path, body, timeout)

    def get(self, path, timeout):
        return self.latent.get(path, timeout)

    def close(self):
        pass


class PlannedServer:
    """verl's `server_manager` for both loops: the workload's grammar, seed and EOS ban per
    (sample, turn), then the async server; records every turn's tokens."""

    def __init__(self, server: Any, plan: Any, seed_of: Any, banned: dict):
        self.server, self.plan, self.seed_of, self.banned = server, plan, seed_of, banned
        self.turns: Counter = Counter()
        self.tokens: dict = {}
        self.spent: Counter = Counter()  # (loop, "engine" | "tools", sample) -> seconds awaited; "calls": count
        self.requests: dict = {}  # (loop, sample, turn) -> what the engine was asked, for the solo replay
        self.seed_mismatch = 0
        self.loop_name = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)

    async def generate(self, request_id: str, *, prompt_ids, sampling_params: dict, image_data=None, **kwargs):
        sample = SAMPLE.get()
        turn = self.turns[request_id]
        self.turns[request_id] += 1
        params = dict(sampling_params)
        params["structured_outputs"] = {"regex": self.plan(sample, turn)}
        seed = self.seed_of(sample, turn)
        if params.get("seed") is not None and params["seed"] != seed:
            self.seed_mismatch += 1
        params.setdefault("seed", seed)
        params["logit_bias"] = {**self.banned, **(params.get("logit_bias") or {})}
        # copies: verl's loop appends the next turn's images to this very list
        self.requests[(self.loop_name, sample, turn)] = (list(prompt_ids), list(image_data or []) or None,
                                                         dict(params), dict(kwargs))
        started = time.perf_counter()
        answer = await self.server.generate(request_id, prompt_ids=prompt_ids, sampling_params=params,
                                            image_data=image_data, **kwargs)
        self.spent[(self.loop_name, "engine", sample)] += time.perf_counter() - started
        self.tokens[(self.loop_name, sample, turn)] = tuple(answer.token_ids)
        return answer

    def timed(self, call: Any, calls_of: Any = lambda args: 1) -> Any:
        """`call` (a coroutine function a trajectory awaits for its tool results), its time and its
        number of tool calls (`calls_of(args)`) recorded."""

        async def timed_call(*args, **kwargs):
            self.spent[(self.loop_name, "calls", SAMPLE.get())] += calls_of(args)
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                self.spent[(self.loop_name, "tools", SAMPLE.get())] += time.perf_counter() - started

        return timed_call

    async def solo_floor(self, loop: str, spent: Counter, least_latency_s: float) -> tuple[float, int, int]:
        """Each of `loop`'s trajectories (its last pass) replayed alone on the engine, turn by turn
        with the same requests, plus the retriever's least latency per tool call: the longest of
        these is a floor under any loop's wall on this engine and retriever. Returns (floor s,
        turns replayed, turns whose tokens differ from the pass's)."""
        turns_of: dict = {}
        for (name, sample, turn), request in self.requests.items():
            if name == loop:
                turns_of.setdefault(sample, []).append((turn, request))
        floor, replayed, differ = 0.0, 0, 0
        for sample, turns in turns_of.items():
            engine = []
            for replay in range(2):  # the quicker of two replays: a noisy one must not raise the floor
                engine.append(0.0)
                for turn, (prompt_ids, image_data, params, kwargs) in sorted(turns, key=lambda item: item[0]):
                    started = time.perf_counter()
                    answer = await self.server.generate(f"solo-{loop}-{sample}-{turn}-{replay}", prompt_ids=prompt_ids,
                                                        sampling_params=params, image_data=image_data, **kwargs)
                    engine[-1] += time.perf_counter() - started
                    replayed += replay == 0
                    differ += replay == 0 and tuple(answer.token_ids) != self.tokens[(loop, sample, turn)]
            floor = max(floor, min(engine) + least_latency_s * spent[(loop, "calls", sample)])
        return floor, replayed, differ


def critical_path(spent: Counter, loop: str) -> tuple[float, float]:
    """The trajectory that awaited the engine and its tools longest: (engine s, tools s). With those
    awaits as they were, a loop spending nothing of its own would still take this long, so wall /
    (engine + tools) bounds what removing the loop's own time could gain."""
    samples = {key[2] for key in spent if key[0] == loop}
    longest = max(samples, key=lambda s: spent[(loop, "engine", s)] + spent[(loop, "tools", s)])
    return spent[(loop, "engine", longest)], spent[(loop, "tools", longest)]


def workload(think_lengths, max_turns: int):
    """(sample, turn) -> the turn's regex: bench_schedules' plan in the native tool-call format."""
    from bench_schedules import planned_turns
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, one_of

    queries = one_of(sorted(SAMPLE_FACTS))
    search = r'<tool_call>\n\{"name": "search", "arguments": \{"query": "(' + queries + r')"\}\}\n</tool_call>'
    fetch = (r'<tool_call>\n\{"name": "fetch", "arguments": \{"page": [1-' + str(DEMO_MAX_PAGE)
             + r'\], "mode": "(image|text)"\}\}\n</tool_call>').replace(r"\]", "]")
    call = f"({search}|{fetch})"

    def plan(sample: int, turn: int) -> str:
        think = random.Random(f"{sample}:{turn}").choice(think_lengths)
        last = turn + 1 >= planned_turns(sample, max_turns)
        action = r"<answer>[a-z ]{1,12}</answer>" if last else "\n" + call
        return rf"<think>[a-z ]{{{think},{think + 8}}}</think>{action}"

    return plan


def cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(Exception):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes of each loop first")
    parser.add_argument("--family", default="qwen2-vl")
    parser.add_argument("--retriever-slots", type=int, default=0,
                        help="requests the retriever serves at once (0: any number, as bench_schedules.py)")
    parser.add_argument("--retriever-concurrency", type=int, default=8,
                        help="each loop's client: requests in flight at once")
    parser.add_argument("--think-lengths", type=lambda text: tuple(int(x) for x in text.split(",")), default=None,
                        help="characters of thought per turn, one picked per turn (default: bench_schedules')")
    args = parser.parse_args()
    return asyncio.run(run(args))


async def run(args: argparse.Namespace) -> int:
    import numpy as np
    from transformers import AutoProcessor

    import verl
    import vllm
    from bench_schedules import THINK_LENGTHS, LatentRetriever, planned_turns
    from verl.experimental.agent_loop import tool_agent_loop  # noqa: F401 - registers tool_agent
    from vrag_rollout.devkit.demo import demo_config, demo_model, demo_page_band, demo_questions
    from vrag_rollout.engine.stand_ins.async_token_server import AsyncTokenServer
    from vrag_rollout.engine.llm import configure_cpu_defaults
    from vrag_rollout.engine.sampling import BANNED_LOGIT_BIAS, request_seed
    from vrag_rollout.integrations.verl import agent_loop
    from vrag_rollout.integrations.verl.local import local_worker, prompt_rows
    from vrag_rollout.integrations.verl.peer_tools import FetchTool, SearchTool
    from vrag_rollout.rollout import tool_batcher
    from vrag_rollout.retrieval.client import RetrieverClient
    from vrag_rollout.retrieval.fixtures import FixtureTransport
    from vrag_rollout.verify.check import check_batch
    from vrag_rollout.verify.saved_batch import from_dataproto

    configure_cpu_defaults()
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=64))  # both loops' tool threads
    model_dir, family = demo_model(args.family)
    processor = AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    config = demo_config(**demo_page_band(processor), action_format="tool_call", n=1, max_turns=args.max_turns,
                         response_length=1536, max_images_per_sample=16,
                         retriever_max_concurrency=args.retriever_concurrency,
                         action_regex=None, retriever_url="http://bench.invalid")
    vision = [tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>")]
    server = AsyncTokenServer.build(str(model_dir), config, config.images_per_sample(), image_pad=vision[0],
                                    banned_token_ids=vision)
    think_lengths = args.think_lengths or THINK_LENGTHS
    plan = workload(think_lengths, args.max_turns)
    planned = PlannedServer(server, plan, lambda sample, turn: request_seed(config.seed, 0, sample, turn),
                            {tokenizer.convert_tokens_to_ids("<|endoftext|>"): BANNED_LOGIT_BIAS})

    # one latent retriever per loop, same seed per run; separate clients so each loop's stats are its own
    transports = {}
    clients = {}
    for name in LOOPS:
        transports[name] = RecordingTransport(LatentRetriever(0, slots=args.retriever_slots or None))
        clients[name] = RetrieverClient(None, transport=transports[name], max_concurrency=config.retriever_max_concurrency)

    class BenchDriver(agent_loop.ServerDriver):
        def _default_retriever(self):
            return clients["vrag_agent"]

    agent_loop.ServerDriver = BenchDriver  # shared_driver builds the loop's driver with it

    class EngineView:  # what local_worker reads of an engine: its model config (logprobs mode)
        llm_engine = server.engine

    settings = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    worker = local_worker(str(model_dir), EngineView(), settings)
    worker.llm_client = planned
    multi_turn = worker.config.actor_rollout_ref.rollout.multi_turn
    multi_turn.update({"format": "hermes", "max_parallel_calls": 1, "max_tool_response_length": 2048,
                       "tool_response_truncate_side": "right", "max_user_turns": args.max_turns,
                       "max_assistant_turns": args.max_turns})
    tool_config = {"client": clients["tool_agent"], "top_n": config.top_n, "band": None}
    from vrag_rollout.core.vision import page_band

    tool_config["band"] = page_band(processor, config.page_min_pixels, config.page_max_pixels)
    with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
        worker.tools = [SearchTool(tool_config, None), FetchTool(tool_config, None)]
    for tool in worker.tools:  # tool_agent awaits each call's execute; vrag_agent awaits its batcher
        tool.execute = planned.timed(tool.execute)
    tool_batcher.ToolBatcher.execute = planned.timed(tool_batcher.ToolBatcher.execute, lambda args: len(args[1]))

    original_run, original_post = worker._run_agent_loop, worker._agent_loop_postprocess

    async def run_agent_loop(sampling_params, trajectory, **kwargs):
        SAMPLE.set(int(kwargs["vrag_sample"]))
        return await original_run(sampling_params, trajectory, **kwargs)

    async def postprocess(output, validate, **kwargs):
        # verl keeps no images in its batch: give `check` the trajectory's images as our loop does
        if "multi_modal_data" not in output.extra_fields:
            output.extra_fields["multi_modal_data"] = {"images": list((output.multi_modal_data or {}).get("images")
                                                                      or [])}
        return await original_post(output, validate, **kwargs)

    worker._run_agent_loop, worker._agent_loop_postprocess = run_agent_loop, postprocess

    questions = (demo_questions() * 8)[: args.prompts]
    rows = {"vrag_agent": prompt_rows(questions, "tool_call", n=args.n)}
    verl_rows = prompt_rows(questions, "tool_call", n=args.n)
    size = len(verl_rows)
    column = np.empty(size, dtype=object)
    column[:] = ["tool_agent"] * size
    verl_rows.non_tensor_batch["agent_name"] = column
    tools_kwargs = np.empty(size, dtype=object)
    tools_kwargs[:] = [{name: {"create_kwargs": {"doc_id": doc}} for name in ("search", "fetch")}
                       for doc in verl_rows.non_tensor_batch["doc_id"]]
    verl_rows.non_tensor_batch["tools_kwargs"] = tools_kwargs
    rows["tool_agent"] = verl_rows

    # grammars compile once per regex in the engine: compile them all before any timing
    warm_ids = tokenizer.encode("warm up", add_special_tokens=False)
    regexes = sorted({plan(s, t) for s in range(size) for t in range(args.max_turns)})
    await asyncio.gather(*[server.generate(f"warm{i}", prompt_ids=warm_ids, sampling_params={
        "max_tokens": 1, "structured_outputs": {"regex": r}}) for i, r in enumerate(regexes)])

    for _ in range(args.warmup):  # first passes pay one-off costs (processor, allocator, caches)
        for name in LOOPS:
            planned.loop_name, planned.turns = f"warmup {name}", Counter()
            await worker.generate_sequences(rows[name])

    results: dict = {name: [] for name in LOOPS}
    core_pids = server.engine_core_pids()
    for repeat in range(args.repeats):
        for name in (LOOPS if repeat % 2 == 0 else LOOPS[::-1]):
            transports[name].reset(repeat)
            clients[name].stats.reset()
            planned.loop_name, planned.turns = name, Counter()
            planned.spent = Counter()
            calls0, frontend0, core0 = server.calls, server.frontend_cpu_s or 0.0, cpu_of(core_pids)
            server.max_in_flight = 0
            cpu0, started = time.process_time(), time.perf_counter()
            batch = await worker.generate_sequences(rows[name])
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
            turns = server.calls - calls0
            frontend = (server.frontend_cpu_s or 0.0) - frontend0
            results[name].append({
                "wall": wall, "cpu": cpu, "frontend": frontend, "core": cpu_of(core_pids) - core0, "turns": turns,
                "in_flight": server.max_in_flight, "stats": clients[name].stats.snapshot(),
                "sizes": Counter(transports[name].sizes), "batch": batch,
                "critical": critical_path(planned.spent, name), "spent": Counter(planned.spent)})

    # ---- report ----
    print(f"verl {verl.__version__}, vllm {vllm.__version__}, {family} tiny model, {args.prompts} prompts x n={args.n} "
          f"= {size} trajectories, max {args.max_turns} turns, {args.warmup} warm-up + {args.repeats} timed passes "
          f"per loop; retriever latency 100-400 ms")
    plan_turns = Counter(planned_turns(s, args.max_turns) for s in range(size))
    print("planned turns per sample: " + ", ".join(f"{k}: {plan_turns[k]}" for k in sorted(plan_turns)))
    print(f"{'loop':<11} {'wall s':>7} {'turns':>6} {'CPU s':>6} {'vLLM front s':>12} {'CPU/turn ms':>11} "
          f"{'core CPU s':>10} {'in flight':>9} {'retr. calls':>11} {'items':>6} {'batch sizes':<20}")
    walls = {}
    for name in LOOPS:
        runs = results[name]
        walls[name] = statistics.median(r["wall"] for r in runs)
        last = runs[-1]
        outside = statistics.median((r["cpu"] - r["frontend"]) / max(r["turns"], 1) for r in runs)
        sizes = Counter()
        for (path, n), count in last["sizes"].items():
            sizes[f"{path}:{n}"] += count
        print(f"{name:<11} {walls[name]:>7.2f} {last['turns']:>6} {last['cpu']:>6.2f} {last['frontend']:>12.2f} "
              f"{outside * 1000:>11.1f} {last['core']:>10.2f} {last['in_flight']:>9} "
              f"{int(last['stats']['calls']):>11} {int(last['stats']['items']):>6} "
              f"{' '.join(f'{k}x{v}' for k, v in sorted(sizes.items())):<20}")
        print(f"{'':<11} wall per repeat: " + ", ".join(f"{r['wall']:.2f}" for r in runs))
    print("critical path (the trajectory awaiting engine + tools longest; median over passes):")
    for name in LOOPS:
        runs = results[name]
        engine = statistics.median(r["critical"][0] for r in runs)
        tools = statistics.median(r["critical"][1] for r in runs)
        ceiling = statistics.median(r["wall"] / sum(r["critical"]) for r in runs)
        print(f"  {name:<11} engine {engine:.2f} s + tools {tools:.2f} s of {walls[name]:.2f} s wall: removing the "
              f"loop's own time, the awaits held, would be at most {ceiling:.2f}x faster than {name} here")
    floor, replayed, differ = await planned.solo_floor("tool_agent", results["tool_agent"][-1]["spent"],
                                                       LatentRetriever.LATENCY_S[0])
    print(f"floor: tool_agent's trajectories replayed alone on the engine, turn by turn ({replayed} turns, "
          f"{replayed - differ} with the same tokens), plus the retriever's least latency "
          f"({LatentRetriever.LATENCY_S[0] * 1000:.0f} ms) per call: the longest takes {floor:.2f} s, so no loop on "
          f"this engine and retriever is more than {walls['tool_agent'] / floor:.2f}x faster than tool_agent; what "
          "lies between is the engine serving all trajectories at once, the retriever's latency draws, and the "
          "loop's own time (bounded above)")
    speedup = walls["tool_agent"] / walls["vrag_agent"]
    paired = [b["wall"] / a["wall"] for a, b in zip(results["vrag_agent"], results["tool_agent"])]
    best = min(r["wall"] for r in results["tool_agent"]) / min(r["wall"] for r in results["vrag_agent"])
    print(f"speed-up vrag_agent over tool_agent: {speedup:.2f}x by median wall (target >= {TARGET_SPEEDUP:g}x) "
          f"{'PASS' if speedup >= TARGET_SPEEDUP else 'FAIL'}; {best:.2f}x by best pass; per repeat "
          + ", ".join(f"{x:.2f}x" for x in paired)
          + (" (spread wider than the target margin: the machine's load, not the loops, decides; "
             "the tokens, prompts and retriever calls above are the same in both)"
             if len(paired) > 1 and max(paired) - min(paired) > TARGET_SPEEDUP - 1 else ""))

    same = sum(1 for (loop, s, t), ids in planned.tokens.items()
               if loop == "vrag_agent" and planned.tokens.get(("tool_agent", s, t)) == ids)
    ours_turns = sum(1 for key in planned.tokens if key[0] == "vrag_agent")
    print(f"turns sampling the same tokens in both loops: {same}/{ours_turns}; vrag_agent seeds that differ from the "
          f"plan's: {planned.seed_mismatch}")
    for name in LOOPS:
        batch = results[name][-1]["batch"]
        columns = batch.non_tensor_batch
        reasons = Counter(str(r) for r in columns.get("termination_reason", [])) if "termination_reason" in columns else None
        print(f"{name}: __num_turns__ (the loop's own count) {dict(sorted(Counter(int(t) for t in columns['__num_turns__']).items()))}"
              + (f", termination {dict(reasons)}" if reasons else ""))
    prompts_same = bool((results["vrag_agent"][-1]["batch"].batch["prompts"]
                         == results["tool_agent"][-1]["batch"].batch["prompts"]).all())
    print(f"prompt tokens identical in both loops: {prompts_same}")

    check_config = {"action_format": "tool_call", "response_length": config.response_length,
                    "page_min_pixels": config.page_min_pixels, "page_max_pixels": config.page_max_pixels}
    failures = {}
    for name in LOOPS:
        saved = from_dataproto(results[name][-1]["batch"], model_path=str(model_dir), processor=processor,
                               config=check_config)
        report = check_batch(saved, model_dir, path=f"<{name} DataProto>")
        failures[name] = len(report.failures)
        kinds = Counter(f.check for f in report.failures)
        print(f"check {name}: {'PASS' if report.ok else 'FAIL'}, {len(report.failures)} failures "
              f"{dict(kinds) if kinds else ''} over {report.samples} samples")
        for failure in report.failures[:6]:
            print(f"    [{failure.check}] sample {failure.sample} pos {failure.position}: {failure.message[:300]}")
        samples = sorted({f.sample for f in report.failures if f.sample is not None})
        if samples:
            print(f"    samples failing: {samples}")
        for note in report.notes[:4]:
            print(f"    note: {note[:200]}")
    print(f"vrag_agent check failures: {failures['vrag_agent']} (target 0) "
          f"{'PASS' if failures['vrag_agent'] == 0 else 'FAIL'}; tool_agent (verl {verl.__version__}): "
          f"{failures['tool_agent']}")
    for client in clients.values():
        client.close()
    server.shutdown()
    return 0 if speedup >= TARGET_SPEEDUP and failures["vrag_agent"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
