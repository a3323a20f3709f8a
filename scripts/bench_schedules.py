"""Turn-synchronized vs continuous rollout schedule: wall time of the same batch, side by side.

Runs the demo's agent (tiny Qwen2-VL on vLLM, recorded retrieval with an added per-call delay
that stands in for a real retriever) with both schedules, interleaved, and prints the medians and
their ratio. Both schedules must produce identical episodes; the script checks that too.

    .venv/bin/python scripts/bench_schedules.py [--batch 12] [--n 4] [--delay-ms 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vrag_rollout.engine import configure_cpu_defaults, create_llm  # noqa: E402
from vrag_rollout.fixtures import FixtureTransport  # noqa: E402
from vrag_rollout.retriever_client import RetrieverClient  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sample_retrieval.json"


class DelayedTransport:
    """Recorded answers after a fixed delay per request, like a retriever across the network."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    def post(self, path, body, timeout):
        time.sleep(self.delay_s)
        return self.inner.post(path, body, timeout)

    def get(self, path, timeout):
        return self.inner.get(path, timeout)

    def close(self):
        self.inner.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["sync", "continuous"], choices=["sync", "continuous"])
    args = parser.parse_args()

    configure_cpu_defaults()
    from transformers import AutoProcessor

    from vrag_rollout import vLLMRolloutAgent
    from vrag_rollout.demo import demo_config, demo_questions
    from vrag_rollout.prompts import build_prompt_batch
    from vrag_rollout.tiny_model import build_tiny_qwen2vl, default_model_dir

    model_dir = build_tiny_qwen2vl(default_model_dir())
    processor = AutoProcessor.from_pretrained(model_dir)
    llm = create_llm(model=str(model_dir), dtype="float32", max_model_len=2048, max_num_batched_tokens=4096,
                     enforce_eager=True,
                     limit_mm_per_prompt={"image": 8, "video": 0}, seed=0)
    questions = (demo_questions() * 4)[: args.batch]
    times: dict[str, list[float]] = {mode: [] for mode in args.modes}
    results = {}
    for _ in range(args.repeats):
        for mode in args.modes:
            transport = DelayedTransport(FixtureTransport.load(FIXTURE), args.delay_ms / 1000)
            config = demo_config(n=args.n, rollout_mode=mode)
            agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm,
                                     retriever=RetrieverClient(None, transport=transport))
            prompts = build_prompt_batch(processor.tokenizer, processor, questions, config.prompt_length)
            started = time.perf_counter()
            results[mode] = agent.generate_sequences(prompts)
            times[mode].append(time.perf_counter() - started)
    same = torch.equal(results["sync"].batch["responses"], results["continuous"].batch["responses"])
    sync, cont = statistics.median(times["sync"]), statistics.median(times["continuous"])
    metrics = results["sync"].meta_info["metrics"]
    print(f"{args.batch} prompts x n={args.n}, retriever delay {args.delay_ms:.0f} ms/request, "
          f"{metrics['rollout/searches'] + metrics['rollout/fetches']:.0f} tool calls, turns max {metrics['rollout/turns_max']:.0f}")
    print(f"turn-synchronized: median {sync:.2f} s   continuous: median {cont:.2f} s   "
          f"speed-up {sync / cont:.2f}x   identical episodes: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
