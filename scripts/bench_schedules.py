"""Turn-synchronized vs continuous rollout schedule on an agent workload with a long tail.

Real vLLM with the tiny Qwen2-VL; the retriever is the recorded one behind an injected latency of
100-400 ms per request with jitter (median about 200 ms). Each sample is given, by its index, a
number of turns from 1 to --max-turns (most short, a few long) and a think length per turn, which
a per-sample grammar makes the random model follow: tool calls until its last turn, then an
answer. Both schedules run the same batch, interleaved, --repeats times; the script prints the
medians side by side with their ratio, the engine-busy share, the loop overhead as a share of
engine time, and whether the episodes were identical.

Targets: continuous at least 2x faster; loop overhead at most 5% of engine time.

On this CPU the engine's step time grows with the batch, so the many small steps of the
continuous schedule cost nearly what the synchronized schedule's few large ones do, and the
engine itself bounds the gain. A second part shows what changes on an engine whose step time does
not depend on the batch (a GPU decoding these batch sizes is memory-bound): the same workload,
the same schedules, loop and retriever, with every turn's tokens replayed from the real run and
each engine step costing `--step-ms` whatever the batch. Its episodes must equal the real ones.

    .venv/bin/python scripts/bench_schedules.py [--prompts 32] [--n 4] [--max-turns 6] [--repeats 2] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vrag_rollout.engine.llm import SAMPLED_LOGPROBS_MODE, configure_cpu_defaults, create_llm  # noqa: E402
from vrag_rollout.retrieval.fixtures import FixtureTransport  # noqa: E402
from vrag_rollout.retrieval.client import RetrieverClient  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sample_retrieval.json"
THINK_LENGTHS = (4, 16, 48, 96)  # characters of thought before an action, varied per turn
TARGET_SPEEDUP = 2.0
TARGET_OVERHEAD = 0.05


class LatentRetriever:
    """Recorded answers after 100-400 ms (triangular, mode 150 ms: median about 200 ms).

    `slots`: how many requests the retriever serves at once (None: any number); a request
    waits for a free slot, then holds it for its latency, as a server with bounded admission
    (the project's server serves `AdmissionLimits.max_in_flight` = 2 at once by default)."""

    LATENCY_S = (0.1, 0.4, 0.15)  # low, high, mode of the triangular draw

    def __init__(self, seed: int, slots: int | None = None):
        self.inner, self.rng = FixtureTransport.load(FIXTURE), random.Random(seed)
        self.slots = threading.Semaphore(slots) if slots else contextlib.nullcontext()

    def post(self, path, body, timeout):
        with self.slots:
            time.sleep(self.rng.triangular(*self.LATENCY_S))
            return self.inner.post(path, body, timeout)

    def get(self, path, timeout):
        return self.inner.get(path, timeout)

    def close(self):
        pass


class RecordingLLM:
    """The real engine, keeping every completion by its request seed (unique per sample and turn)."""

    def __init__(self, llm: Any):
        self.llm, self.completions = llm, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    def generate(self, prompts, params, use_tqdm=False):
        outputs = self.llm.generate(prompts, params, use_tqdm=use_tqdm)
        for param, output in zip(params, outputs):
            self.completions[param.seed] = output.outputs[0]
        return outputs


class FlatStepLLM:
    """Replays recorded completions at a fixed cost per engine step, whatever the batch: a
    request of L tokens finishes on its L-th step (its prefill samples the first token)."""

    def __init__(self, completions: dict, step_seconds: float):
        self.completions, self.step_seconds = completions, step_seconds
        self.llm_engine = self  # the continuous schedule's add_request / step / abort_request
        self.running: dict = {}
        self.steps = 0

    def generate(self, prompts, params, use_tqdm=False):
        outputs = [self.completions[param.seed] for param in params]
        steps = max(len(output.token_ids) for output in outputs)
        self.steps += steps
        time.sleep(steps * self.step_seconds)
        return [SimpleNamespace(outputs=[output]) for output in outputs]

    def add_request(self, request_id, prompt, params):
        self.running[request_id] = [self.completions[params.seed], 0]

    def step(self):
        self.steps += 1
        time.sleep(self.step_seconds)
        finished = []
        for request_id, state in list(self.running.items()):
            state[1] += 1
            if state[1] >= len(state[0].token_ids):
                del self.running[request_id]
                finished.append(SimpleNamespace(request_id=request_id, finished=True, outputs=[state[0]]))
        return finished

    def abort_request(self, request_ids):
        for request_id in request_ids:
            self.running.pop(request_id, None)

    def has_unfinished_requests(self):
        return bool(self.running)


def planned_turns(sample: int, max_turns: int) -> int:
    """A long tail: half the samples answer on turn 1 or 2, a few use every turn."""
    rng = random.Random(sample)
    return min(max_turns, 1 + int(rng.expovariate(1 / (max_turns / 4))))


def make_agent_class(think_lengths=THINK_LENGTHS):
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from vllm.sampling_params import StructuredOutputsParams

    from vrag_rollout import vLLMRolloutAgent
    from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, one_of
    from vrag_rollout.rollout.driver import EpisodeDriver

    queries = one_of(sorted(SAMPLE_FACTS))
    tool = rf"(<search>({queries})</search>|<fetch>(image|text), [1-{DEMO_MAX_PAGE}]</fetch>)"

    class PlannedDriver(EpisodeDriver):
        """Tool calls until the sample's planned last turn, then an answer."""

        def request(self, episode, turn):
            prompt, params = super().request(episode, turn)
            rng = random.Random(f"{episode.index}:{turn}")
            think = rng.choice(think_lengths)
            action = r"<answer>[a-z ]{1,12}</answer>" if turn + 1 >= planned_turns(episode.index, self.max_turns) else tool
            params.structured_outputs = StructuredOutputsParams(regex=rf"<think>[a-z ]{{{think},{think + 8}}}</think>{action}")
            return prompt, params

    class PlannedAgent(vLLMRolloutAgent):
        driver_class = PlannedDriver

    return PlannedAgent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--think-lengths", type=lambda text: tuple(int(x) for x in text.split(",")),
                        default=THINK_LENGTHS, help=f"characters of thought per turn, one picked per turn "
                                                    f"(default {','.join(map(str, THINK_LENGTHS))})")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="engine step time of the batch-independent engine (a 7B model's decode step on one GPU)")
    args = parser.parse_args()

    configure_cpu_defaults()
    from transformers import AutoProcessor

    from vrag_rollout.devkit.demo import demo_config, demo_page_band, demo_questions
    from vrag_rollout.data.prompts import build_prompt_batch
    from vrag_rollout.devkit.tiny_model import build_tiny_qwen2vl, default_model_dir

    model_dir = build_tiny_qwen2vl(default_model_dir())
    processor = AutoProcessor.from_pretrained(model_dir)
    llm = create_llm(model=str(model_dir), dtype="float32", max_model_len=2048, max_num_batched_tokens=4096,
                     enforce_eager=True, limit_mm_per_prompt={"image": 16, "video": 0}, seed=0,
                     logprobs_mode=SAMPLED_LOGPROBS_MODE)
    agent_cls = make_agent_class(args.think_lengths)
    questions = (demo_questions() * 8)[: args.prompts]
    modes = ("sync", "continuous")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    results: dict = {}
    recording = RecordingLLM(llm)

    def run(mode: str, engine: Any, seed: int) -> tuple[float, Any]:
        config = demo_config(**demo_page_band(processor), n=args.n, rollout_mode=mode, max_turns=args.max_turns,
                             response_length=1536, max_images_per_sample=16, retriever_max_concurrency=8)
        client = RetrieverClient(None, transport=LatentRetriever(seed), max_concurrency=8)
        agent = agent_cls(str(model_dir), config, processor.tokenizer, processor, inference_engine=engine, retriever=client)
        prompts = build_prompt_batch(processor.tokenizer, processor, questions, config.prompt_length)
        started = time.perf_counter()
        output = agent.generate_sequences(prompts)
        return time.perf_counter() - started, output

    for repeat in range(args.repeats):
        for mode in modes:
            elapsed, results[mode] = run(mode, recording if mode == "sync" else llm, repeat)
            times[mode].append(elapsed)

    same = all(torch.equal(results["sync"].batch[k], results["continuous"].batch[k])
               for k in ("responses", "loss_mask", "position_ids"))
    turns = [int(t) for t in results["sync"].non_tensor_batch["num_turns"]]
    print(f"{args.prompts} prompts x n={args.n}; turns per sample: "
          + ", ".join(f"{k}: {turns.count(k)}" for k in range(1, args.max_turns + 1))
          + "; retriever latency 100-400 ms (median ~200 ms)")
    print(f"{'schedule':<18} {'wall s':>7} {'engine s':>9} {'busy':>6} {'overhead/engine':>16} {'blocked on retriever s':>23}")
    for mode in modes:
        m = results[mode].meta_info["metrics"]
        print(f"{mode:<18} {statistics.median(times[mode]):>7.2f} {m['rollout/engine_seconds']:>9.2f} "
              f"{m['rollout/engine_busy_share']:>6.0%} {m['rollout/loop_overhead_share_of_engine']:>16.1%} "
              f"{m['rollout/blocked_on_retriever_seconds']:>23.2f}")
    speedup = statistics.median(times["sync"]) / statistics.median(times["continuous"])
    overhead = results["continuous"].meta_info["metrics"]["rollout/loop_overhead_share_of_engine"]
    print(f"speed-up continuous / synchronized: {speedup:.2f}x (target >= {TARGET_SPEEDUP:g}x) "
          f"{'PASS' if speedup >= TARGET_SPEEDUP else 'FAIL'}")
    print(f"continuous loop overhead: {overhead:.1%} of engine time (target <= {TARGET_OVERHEAD:.0%}) "
          f"{'PASS' if overhead <= TARGET_OVERHEAD else 'FAIL'}")
    print(f"identical episodes: {same}")

    # ---- the same workload on an engine whose step time does not grow with the batch ----
    flat_times, flat_steps, flat_same = {}, {}, True
    for mode in modes:
        engine = FlatStepLLM(recording.completions, args.step_ms / 1000)
        flat_times[mode], output = run(mode, engine, 0)
        flat_steps[mode] = engine.steps
        flat_same &= all(torch.equal(output.batch[k], results["sync"].batch[k])
                         for k in ("responses", "loss_mask", "position_ids"))
    flat_speedup = flat_times["sync"] / flat_times["continuous"]
    # No schedule that finishes the batch takes fewer steps than its longest sample's own turns
    # (each sampled token is one step of that request), nor less time than that many steps.
    own = results["sync"].batch["loss_mask"].sum(-1)
    fewest = int(own.max())
    print(f"\nbatch-independent engine ({args.step_ms:g} ms per step, each turn's tokens replayed from the run above):")
    for mode in modes:
        print(f"{mode:<18} {flat_times[mode]:>7.2f} s  {flat_steps[mode]:>6} engine steps")
    print(f"speed-up continuous / synchronized: {flat_speedup:.2f}x (target >= {TARGET_SPEEDUP:g}x) "
          f"{'PASS' if flat_speedup >= TARGET_SPEEDUP else 'FAIL'}; identical episodes: {flat_same}")
    print(f"fewest steps any schedule can take: {fewest} (the longest sample's own sampled tokens), so on this "
          f"engine no schedule beats synchronized by more than {flat_steps['sync'] / fewest:.2f}x in engine steps "
          f"plus the {results['sync'].meta_info['metrics']['rollout/blocked_on_retriever_seconds']:.2f} s it waits "
          f"on the retriever")
    return 0 if same and flat_same and speedup >= TARGET_SPEEDUP and overhead <= TARGET_OVERHEAD else 1


if __name__ == "__main__":
    sys.exit(main())
