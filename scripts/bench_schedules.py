"""Turn-synchronized vs continuous rollout schedule on an agent workload with a long tail.

Real vLLM with the tiny Qwen2-VL; the retriever is the recorded one behind an injected latency of
100-400 ms per request with jitter (median about 200 ms). Each sample is given, by its index, a
number of turns from 1 to --max-turns (most short, a few long) and a think length per turn, which
a per-sample grammar makes the random model follow: tool calls until its last turn, then an
answer. Both schedules run the same batch, interleaved, --repeats times; the script prints the
medians side by side with their ratio, the engine-busy share, the loop overhead as a share of
engine time, and whether the episodes were identical.

Targets: continuous at least 2x faster; loop overhead at most 5% of engine time.

    .venv/bin/python scripts/bench_schedules.py [--prompts 32] [--n 4] [--max-turns 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vrag_rollout.engine import SAMPLED_LOGPROBS_MODE, configure_cpu_defaults, create_llm  # noqa: E402
from vrag_rollout.fixtures import FixtureTransport  # noqa: E402
from vrag_rollout.retriever_client import RetrieverClient  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sample_retrieval.json"
THINK_LENGTHS = (4, 16, 48, 96)  # characters of thought before an action, varied per turn
TARGET_SPEEDUP = 2.0
TARGET_OVERHEAD = 0.05


class LatentRetriever:
    """Recorded answers after 100-400 ms (triangular, mode 150 ms: median about 200 ms)."""

    def __init__(self, seed: int):
        self.inner, self.rng = FixtureTransport.load(FIXTURE), random.Random(seed)

    def post(self, path, body, timeout):
        time.sleep(self.rng.triangular(0.1, 0.4, 0.15))
        return self.inner.post(path, body, timeout)

    def get(self, path, timeout):
        return self.inner.get(path, timeout)

    def close(self):
        pass


def planned_turns(sample: int, max_turns: int) -> int:
    """A long tail: half the samples answer on turn 1 or 2, a few use every turn."""
    rng = random.Random(sample)
    return min(max_turns, 1 + int(rng.expovariate(1 / (max_turns / 4))))


def make_agent_class():
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from vllm.sampling_params import StructuredOutputsParams

    from vrag_rollout import vLLMRolloutAgent
    from vrag_rollout.demo import DEMO_MAX_PAGE, _regex_literal

    queries = "|".join(_regex_literal(q) for q in sorted(SAMPLE_FACTS))
    tool = rf"(<search>({queries})</search>|<fetch>(image|text), [1-{DEMO_MAX_PAGE}]</fetch>)"

    class PlannedAgent(vLLMRolloutAgent):
        """Tool calls until the sample's planned last turn, then an answer."""

        def _request(self, episode, turn):
            prompt, params = super()._request(episode, turn)
            rng = random.Random(f"{episode.index}:{turn}")
            think = rng.choice(THINK_LENGTHS)
            action = r"<answer>[a-z ]{1,12}</answer>" if turn + 1 >= planned_turns(episode.index, self.max_turns) else tool
            params.structured_outputs = StructuredOutputsParams(regex=rf"<think>[a-z ]{{{think},{think + 8}}}</think>{action}")
            return prompt, params

    return PlannedAgent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    configure_cpu_defaults()
    from transformers import AutoProcessor

    from vrag_rollout.demo import demo_config, demo_page_band, demo_questions
    from vrag_rollout.prompts import build_prompt_batch
    from vrag_rollout.tiny_model import build_tiny_qwen2vl, default_model_dir

    model_dir = build_tiny_qwen2vl(default_model_dir())
    processor = AutoProcessor.from_pretrained(model_dir)
    llm = create_llm(model=str(model_dir), dtype="float32", max_model_len=2048, max_num_batched_tokens=4096,
                     enforce_eager=True, limit_mm_per_prompt={"image": 16, "video": 0}, seed=0,
                     logprobs_mode=SAMPLED_LOGPROBS_MODE)
    agent_cls = make_agent_class()
    questions = (demo_questions() * 8)[: args.prompts]
    modes = ("sync", "continuous")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    results: dict = {}
    for repeat in range(args.repeats):
        for mode in modes:
            config = demo_config(**demo_page_band(processor), n=args.n, rollout_mode=mode, max_turns=args.max_turns,
                                 response_length=1536, max_images_per_sample=16, retriever_max_concurrency=8)
            client = RetrieverClient(None, transport=LatentRetriever(repeat), max_concurrency=8)
            agent = agent_cls(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm, retriever=client)
            prompts = build_prompt_batch(processor.tokenizer, processor, questions, config.prompt_length)
            started = time.perf_counter()
            results[mode] = agent.generate_sequences(prompts)
            times[mode].append(time.perf_counter() - started)

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
    return 0 if same and speedup >= TARGET_SPEEDUP and overhead <= TARGET_OVERHEAD else 1


if __name__ == "__main__":
    sys.exit(main())
