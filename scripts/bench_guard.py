"""The live guard's cost: its CPU time per sample, and as a share of the rollout's time, on two
workloads measured side by side in one run, with where the time goes.

- `demo`: the demo workload. Real vLLM with a tiny model of the chosen family; the demo's
  questions, grammar, recorded retrieval and small pages (16-64 visual tokens);
  `--batch-size` questions x `--n` samples; the rollout runs twice (the first warms the engine),
  the second is timed.
- `8k`: 8,192-token responses with 10 retrieved pages each, `--batch-size-8k` questions x `--n`
  samples. A real rollout of it is too slow here: the tiny model on this 2-core CPU, with a
  grammar forcing a long thought and a page fetch per turn, took 373.6 s for ONE batch of 2
  samples (5,890-token responses, 10 pages each; 186.8 s a sample, `TINY_8K_S_PER_SAMPLE`). So
  this batch is built by the rollout itself with only the model's sampling scripted
  (`ScriptedSampler`): each turn is `<think>` + random lowercase words + `</think><fetch>image,
  k</fetch>` (k in 1..3; the text a grammar-bound tiny model writes is noise too), cut at the
  request's `max_tokens` like vLLM's length stop. Everything else is the rollout's own code:
  the agent's driver and turn loop, recorded retrieval (`tests/fixtures/sample_retrieval.json`),
  pages resized into the family's DEFAULT page band (256-512 visual tokens a page, the
  trainer's setting), observations, batch assembly, mrope positions. `response_length` 8192,
  `max_turns` 11: turns 1-10 each fetch a page; the thought's length is set so 10 turns fit
  and the 11th runs into the budget ("length"), so every response is 8,192 tokens.

The guard inspects each batch `--repeats` times: every check on every sample, mrope positions
against the guard's vectorised rule (`positions_fraction` 0), and with the family's own
`get_rope_index` also run on `--positions` of the samples (the guard's default), so the two parts
of its cost show apart. Goal (issue 35): under 1% of the rollout's time with
structural checks on every sample.

A tiny model on this CPU rolls out far slower than a real model on a GPU, which flatters the
ratio. So each case is also held against a GPU reference, stated in the output: the batch's
sampled tokens (loss-mask tokens) per sample decoded at `--gpu-tokens-per-s` generated tokens
a second per GPU (vLLM, a 7B VL model in bf16 on one H100 at large batch: about 5,000) on
`--gpus` rollout GPUs whose batch the guard inspects in one process: 1 by default, since the
guard runs where each GPU's share of the batch is made (EasyR1: every rollout worker, one a
GPU, guards its own chunk; verl: each agent-loop worker guards its chunk). Prefill (prompts, pages)
and tool calls are left out of that reference, so it is a lower bound on the GPU rollout's
time and the share printed against it an upper bound.

"Where the time goes": one structural-only inspection of each batch under cProfile, per check
(cumulative time of each check function, over the batch, per sample) and the top functions by
own time. cProfile's overhead inflates Python-heavy code, so these are shares, not timings.

    .venv/bin/python scripts/bench_guard.py [--family qwen2-vl] [--batch-size 8] [--n 4]
        [--batch-size-8k 8] [--repeats 3] [--cases demo,8k]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vrag_rollout.devkit.scripted_sampler import ScriptedSampler  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "sample_retrieval.json"

LONG_RESPONSE = 8192
LONG_PAGES = 10  # pages shown per episode in the 8k case: one fetch per turn, turns 1..10
# The real tiny-model rollout of the 8k workload on this CPU, measured once (see the docstring).
TINY_8K_S_PER_SAMPLE = 373.6 / 2

# The functions whose cumulative time is "a check" in the breakdown (module suffix, name).
CHECKS = (
    ("guard.py", "_in_memory_view"), ("guard.py", "_images"), ("rows.py", "sample_rows"),
    ("contract.py", "check_shapes"), ("contract.py", "check_row_contract"), ("contract.py", "check_padded_rows"),
    ("images.py", "vision_blocks"), ("images.py", "vision_in_loss"), ("guard.py", "_image_runs"),
    ("observations.py", "check_observations"), ("observations.py", "check_native_observations"),
    ("turns.py", "check_turns"), ("groups.py", "check_groups"), ("positions.py", "check_positions"),
)


def page_tokens(processor: Any, config: Any) -> int:
    """Visual tokens of one recorded page after the rollout's page band (what a fetch shows)."""
    import base64
    import io
    import json

    from PIL import Image

    from vrag_rollout.core.vision import page_band

    band = page_band(processor, config.page_min_pixels, config.page_max_pixels)
    blob = next(iter(json.loads(FIXTURES.read_text())["blobs"].values()))
    with Image.open(io.BytesIO(base64.b64decode(blob))) as image:
        width, height = image.size
    out = processor.image_processor(images=[Image.new("RGB", (width, height))], return_tensors="pt",
                                    size={"shortest_edge": band.min_pixels, "longest_edge": band.max_pixels})
    merge = int(processor.image_processor.merge_size)
    return int(out["image_grid_thw"][0].prod()) // (merge * merge)


def timed_rollout(agent: Any, prompts: Any) -> tuple[Any, float]:
    agent.generate_sequences(prompts)  # warm-up: the engine's first batch compiles and caches
    started = time.perf_counter()
    output = agent.generate_sequences(prompts)
    return output, time.perf_counter() - started


def guard_seconds(guard: Any, output: Any, config: Any, repeats: int) -> tuple[float, Any]:
    """Median CPU seconds of one inspection of the whole batch, and its report."""
    times, report = [], None
    for _ in range(repeats):
        began = time.process_time()
        report = guard.inspect(output, config)
        times.append(time.process_time() - began)
    return statistics.median(times), report


def breakdown(guard: Any, output: Any, config: Any, samples: int, top: int = 10) -> list[str]:
    """Per check and per function, where one structural inspection spends its time (cProfile)."""
    profile = cProfile.Profile()
    profile.runcall(guard.inspect, output, config)
    stats = pstats.Stats(profile)
    total = stats.total_tt
    lines = [f"  profile of one structural inspection: {1000 * total / samples:.2f} ms/sample under cProfile"]
    per_check = {}
    for (path, _line, name), (_cc, _nc, _tt, cumulative, _callers) in stats.stats.items():
        for suffix, wanted in CHECKS:
            if name == wanted and path.endswith(suffix):
                per_check[f"{suffix[:-3]}.{name}"] = per_check.get(f"{suffix[:-3]}.{name}", 0.0) + cumulative
    for name, seconds in sorted(per_check.items(), key=lambda item: -item[1]):
        lines.append(f"    {name:<38} {1000 * seconds / samples:8.3f} ms/sample  {100 * seconds / total:5.1f}%")
    lines.append(f"  top {top} functions by own time:")
    ranked = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    for (path, line, name), (_cc, calls, own, _cum, _callers) in ranked:
        where = f"{Path(path).name}:{line}({name})" if line else name
        lines.append(f"    {where[:60]:<60} {calls:>8} calls {1000 * own / samples:8.3f} ms/sample")
    return lines


def report_case(name: str, output: Any, config: Any, rollout_s: float, model_dir: Path, args: Any,
                tiny_rollout_s: Optional[float] = None) -> None:
    """Print one case: the batch, the rollout's time, the guard's time and shares, the breakdown.
    `tiny_rollout_s`: the real tiny-model rollout's seconds per sample where `rollout_s` is not
    one (the 8k case's scripted sampling)."""
    from vrag_rollout.verify.guard import Guard

    samples = len(output)
    structural_s, report = guard_seconds(Guard(model_dir, positions_fraction=0.0), output, config, args.repeats)
    with_positions_s, _ = guard_seconds(Guard(model_dir, positions_fraction=args.positions), output, config,
                                        args.repeats)
    images = [len(item.get("images", [])) for item in output.non_tensor_batch["multi_modal_data"]]
    used = output.batch["attention_mask"][:, -output.batch["responses"].shape[1]:].sum(1)
    sampled = output.batch.get("loss_mask", output.batch["response_mask"]).sum(1).float()
    reasons = sorted(set(output.non_tensor_batch.get("termination_reason", [])))
    gpu_s = float(sampled.mean()) / args.gpu_tokens_per_s / args.gpus  # per sample
    print(f"\n== {name}: {samples} samples, response_length {config.response_length}, "
          f"responses of {int(used.min())}-{int(used.max())} tokens (mean {float(used.float().mean()):.0f}), "
          f"{float(sampled.mean()):.0f} sampled; images per sample {min(images)}-{max(images)}; "
          f"{int(output.batch['attention_mask'].sum())} attended tokens; ended {reasons}")
    print(f"guard verdict on the clean batch: {len(report.bad_samples)} bad samples")
    if tiny_rollout_s is None:
        tiny_rollout_s = rollout_s / samples
        print(f"rollout wall time (tiny model, this CPU): {rollout_s:8.2f} s  ({1000 * tiny_rollout_s:8.1f} ms/sample)")
    else:
        print(f"rollout wall time, scripted sampling (no model): {rollout_s:8.2f} s  "
              f"({1000 * rollout_s / samples:8.1f} ms/sample)")
        print(f"real tiny-model rollout of this workload, measured once on this CPU: {tiny_rollout_s:8.1f} s/sample")
    print(f"GPU reference: {float(sampled.mean()):.0f} sampled tokens/sample at {args.gpu_tokens_per_s:.0f} tok/s/GPU "
          f"x {args.gpus} GPUs = {1000 * gpu_s:.1f} ms/sample (decode only: a lower bound)")
    for label, seconds in (("guard, every check, mrope rule", structural_s),
                           (f"+ get_rope_index on {args.positions:.1%}", with_positions_s)):
        per_sample = seconds / samples
        print(f"{label:<28} {1000 * per_sample:8.2f} ms/sample  {100 * per_sample / tiny_rollout_s:6.2f}% of the "
              f"tiny-model rollout  {100 * per_sample / gpu_s:6.2f}% of the GPU reference")
    print("\n".join(breakdown(Guard(model_dir, positions_fraction=0.0), output, config, samples)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen2-vl")
    parser.add_argument("--action-format", default="tags")
    parser.add_argument("--batch-size", type=int, default=8, help="questions of the demo case")
    parser.add_argument("--batch-size-8k", type=int, default=8, help="questions of the 8k case")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--positions", type=float, default=0.125, help="share of samples whose mrope is also compared with get_rope_index")
    parser.add_argument("--cases", default="demo,8k")
    parser.add_argument("--gpu-tokens-per-s", type=float, default=5000.0,
                        help="generated tokens a second one rollout GPU decodes (reference)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="rollout GPUs whose batch one guard process inspects (1: EasyR1 and verl guard per worker)")
    args = parser.parse_args()
    cases = args.cases.split(",")

    from transformers import AutoProcessor

    from vrag_rollout.devkit.demo import demo_config, demo_model, demo_page_band, demo_prompts, demo_questions
    from vrag_rollout.engine.llm import configure_cpu_defaults
    from vrag_rollout.rollout.agent import vLLMRolloutAgent

    configure_cpu_defaults()
    model_dir, _ = demo_model(args.family)
    processor = AutoProcessor.from_pretrained(model_dir)
    common = dict(retriever_fixtures=str(FIXTURES), n=args.n, action_format=args.action_format)
    if "demo" in cases:
        questions = (demo_questions() * args.batch_size)[:args.batch_size]
        config = demo_config(**common, **demo_page_band(processor))
        agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor)
        output, rollout_s = timed_rollout(agent, demo_prompts(processor.tokenizer, processor, questions, config))
        report_case(f"demo ({args.family}, {args.action_format}), real tiny-model rollout", output, config,
                    rollout_s, model_dir, args)
    if "8k" in cases:
        # The family's default page band (no page_min/max_pixels): the trainer's page size.
        config = demo_config(**common, response_length=LONG_RESPONSE, max_turns=LONG_PAGES + 1,
                             max_images_per_sample=LONG_PAGES + 1, rollout_mode="sync")
        per_page = page_tokens(processor, config)
        # A turn costs its thought, the fetch call (~10 tokens) and the page's observation (its
        # visual tokens + ~12): 10 turns take ~95% of the budget, the 11th runs into it.
        thought = int(0.95 * LONG_RESPONSE) // LONG_PAGES - per_page - 22
        # No engine: the scripted sampler stands in for its sampling, which the turn-synchronized
        # schedule asks of `agent.engine` (nothing else reads the engine).
        agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=object())
        agent.engine = ScriptedSampler(processor.tokenizer, thought)
        questions = (demo_questions() * args.batch_size_8k)[:args.batch_size_8k]
        output, rollout_s = timed_rollout(agent, demo_prompts(processor.tokenizer, processor, questions, config))
        report_case(f"8k ({args.family}, {args.action_format}, {per_page} tokens a page), scripted sampling",
                    output, config, rollout_s, model_dir, args, tiny_rollout_s=TINY_8K_S_PER_SAMPLE)


if __name__ == "__main__":
    main()
