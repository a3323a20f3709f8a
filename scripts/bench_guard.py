"""The live guard's cost on the demo workload: its CPU time per sample, and as a share of the
rollout's wall time, measured side by side in one run.

Real vLLM with a tiny model of the chosen family; the demo's questions, grammar and recorded
retrieval; `--batch-size` questions x `--n` samples. The rollout runs once (timed), then the
guard inspects its batch `--repeats` times with the mrope comparison on `--positions` of the
samples, and once with structural checks only (`--positions 0`), so the two parts of its cost
show apart. Goal (issue 35): under 1% of the rollout's time with structural checks on every
sample. On this CPU the tiny model's rollout is slow, which flatters the ratio; the per-sample
time is the number to hold against a GPU rollout's time per sample.

    .venv/bin/python scripts/bench_guard.py [--family qwen2-vl] [--batch-size 8] [--n 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen2-vl")
    parser.add_argument("--action-format", default="tags")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--positions", type=float, default=0.125, help="share of samples whose mrope is compared")
    args = parser.parse_args()

    from transformers import AutoProcessor

    from vrag_rollout.devkit.demo import demo_config, demo_model, demo_page_band, demo_prompts, demo_questions
    from vrag_rollout.engine.llm import configure_cpu_defaults
    from vrag_rollout.rollout.agent import vLLMRolloutAgent
    from vrag_rollout.verify.guard import Guard

    configure_cpu_defaults()
    model_dir, _ = demo_model(args.family)
    processor = AutoProcessor.from_pretrained(model_dir)
    questions = (demo_questions() * args.batch_size)[:args.batch_size]
    config = demo_config(retriever_fixtures=str(REPO / "tests" / "fixtures" / "sample_retrieval.json"),
                         n=args.n, action_format=args.action_format, **demo_page_band(processor))
    agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor)
    prompts = demo_prompts(processor.tokenizer, processor, questions, config)
    agent.generate_sequences(prompts)  # warm-up: the engine's first batch compiles and caches
    started = time.perf_counter()
    output = agent.generate_sequences(prompts)
    rollout_s = time.perf_counter() - started
    samples = len(output)

    def cpu_seconds(guard: Guard) -> tuple[float, object]:
        times, report = [], None
        for _ in range(args.repeats):
            began = time.process_time()
            report = guard.inspect(output, config)
            times.append(time.process_time() - began)
        return statistics.median(times), report

    structural_s, report = cpu_seconds(Guard(model_dir, positions_fraction=0.0))
    with_positions_s, _ = cpu_seconds(Guard(model_dir, positions_fraction=args.positions))
    images = sum(len(item.get("images", [])) for item in output.non_tensor_batch["multi_modal_data"])
    tokens = int(output.batch["attention_mask"].sum())
    print(f"batch: {samples} samples, {tokens} attended tokens, {images} images ({args.family}, {args.action_format})")
    print(f"guard verdict on the clean batch: {len(report.bad_samples)} bad samples")
    print(f"rollout wall time:            {rollout_s:8.2f} s  ({1000 * rollout_s / samples:8.1f} ms/sample)")
    for name, seconds in (("guard, structural only", structural_s),
                          (f"guard, + mrope on {args.positions:.0%}", with_positions_s)):
        print(f"{name:<29} {seconds:8.3f} s  ({1000 * seconds / samples:8.1f} ms/sample)  "
              f"{100 * seconds / rollout_s:6.2f}% of the rollout")


if __name__ == "__main__":
    main()
