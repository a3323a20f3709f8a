"""Long episodes within a visual budget: what each budget and context edit costs and saves (issue 49).

The rollout is real: vLLM on the CPU with the tiny Qwen2-VL, the demo's questions (no prompt
image), recorded retrieval (tests/fixtures/sample_retrieval.json), and a search-only grammar
(every turn thinks and searches: two result pages a turn, no answer), so every episode runs all
its --turns turns. Each turn count runs every setting side by side, on one engine:

- `none`:       no budget (every page at the full band, one row per episode: today's batch);
- `thumbs`:     search results as thumbnails (`search_page_max_pixels`, --thumb-tokens a page);
- `budget`:     a per-episode visual-token budget (`visual_token_budget`, --budget tokens);
                later pages' band is lowered as it is spent;
- `keep2-stub`: context edits, images of the last 2 turns kept (`context_keep_turns=2`), older
                ones replaced by a text stub: one training row (segment) per edit;
- `keep2-thumb`: the same, older images replaced by thumbnails (`context_edit_form="thumbnail"`).
- `keep2-slack3`: `keep2-stub` editing only once an image is 3 turns past the limit
  (`context_edit_slack=3`): a quarter of the rows, longer rows.

Page sizes: `--band real` (default) upscales the fixtures' 252x336 pages into a band of
--page-tokens visual tokens (min..max; ~270 tokens a page by default, where released settings
give 256-1,024), which is what makes the savings visible; `--band demo` keeps the demo's 16-64.

Printed per turn count and setting (numbers per episode are means over the episodes):
- `rows`: training rows (episodes, or segments under context edits);
- `vis/ep shown`: visual tokens of the pages an episode was shown, each counted once, when shown
  (a row's image tokens after its context: what the retriever's pages cost the engine first time);
- `vis/ep rows`: visual tokens over all of an episode's rows (what the trainer processes: a segment
  row repeats its context's images, stubbed or thumbnailed);
- `peak vis/row`, `peak tok/row`: the largest row's visual tokens and its tokens in all (prompt and
  response): what one forward pass must hold;
- `images KB`: the pickled image column (one shared entry per distinct page and size), `batch KB`:
  the pickled DataProto (as Ray sends it; its tensors are padded to --response-length per row),
  `saved KB`: `save_rollout`'s file;
- `wall s`: the rollout's wall time (generate_sequences; one untimed warm-up rollout first);
then each setting's ratio to `none` at the same turn count.

    .venv/bin/python scripts/bench_context.py [--turns 4,8,16] [--prompts 2] [--n 2] [--band real|demo]
        [--check]   # also run the independent checker (no forward pass) on every saved batch
"""

from __future__ import annotations

import argparse
import os
import pickle
from collections import Counter
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures" / "sample_retrieval.json"
SETTINGS = ("none", "thumbs", "budget", "keep2-stub", "keep2-thumb", "keep2-slack3")
COLUMNS = ("rows", "vis/ep shown", "vis/ep rows", "peak vis/row", "peak tok/row", "images KB", "batch KB", "saved KB",
           "wall s")


def setting_overrides(name: str, unit: int, args: Any) -> dict:
    """The config fields of one setting (`unit`: pixels of one visual token)."""
    thumbs = args.thumb_tokens * unit
    return {
        "none": {},
        "thumbs": {"search_page_max_pixels": thumbs},
        "budget": {"visual_token_budget": args.budget},
        "keep2-stub": {"context_keep_turns": 2, "context_edit_form": "stub"},
        "keep2-thumb": {"context_keep_turns": 2, "context_edit_form": "thumbnail", "search_page_max_pixels": None},
        "keep2-slack3": {"context_keep_turns": 2, "context_edit_form": "stub", "context_edit_slack": 3},
    }[name]


def band(processor: Any, kind: str, page_tokens: tuple[int, int]) -> dict:
    from vrag_rollout.devkit.demo import demo_page_band

    if kind == "demo":
        return demo_page_band(processor)
    ip = processor.image_processor
    unit = (int(ip.patch_size) * int(ip.merge_size)) ** 2
    return {"page_min_pixels": page_tokens[0] * unit, "page_max_pixels": page_tokens[1] * unit}


def measure(output: Any, image_pad: int) -> dict:
    """The table's numbers from the batch alone (rows of one episode share `episode_id`)."""
    t, columns = output.batch, output.non_tensor_batch
    P = t["prompts"].shape[1]
    rows = len(output)
    used = t["attention_mask"].sum(dim=-1)
    visual_row = (t["input_ids"] == image_pad).long() * t["attention_mask"].long()
    episodes = columns["episode_id"].tolist() if "episode_id" in columns else list(range(rows))
    context = columns["context_length"].tolist() if "context_length" in columns else [0] * rows
    shown: dict[int, int] = {}
    in_rows: dict[int, int] = {}
    for row, episode in enumerate(episodes):
        own = visual_row[row, P + int(context[row]):].sum().item()  # pages first shown in this row
        shown[episode] = shown.get(episode, 0) + own
        in_rows[episode] = in_rows.get(episode, 0) + visual_row[row].sum().item()
    count = max(len(shown), 1)
    return {
        "rows": rows,
        "episodes": len(shown),
        "vis/ep shown": sum(shown.values()) / count,
        "vis/ep rows": sum(in_rows.values()) / count,
        "peak vis/row": int(visual_row.sum(dim=-1).max()),
        "peak tok/row": int(used.max()),
        "turns": sum(int(x) for x, final in zip(columns["num_turns"], _finals(columns)) if final) / count,
        "reasons": sorted({str(r) for r in columns["termination_reason"]}),
    }


def _finals(columns: dict) -> list[bool]:
    """Whether each row is its episode's last (a row an edit closed says "context_edit")."""
    return [reason != "context_edit" for reason in columns["termination_reason"]]


def run_one(model_dir: Path, processor: Any, llm: Any, turns: int, overrides: dict, args: Any,
            folder: Path) -> tuple[dict, Any]:
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, demo_config, demo_prompts, demo_questions, one_of, turn_regex
    from vrag_rollout.rollout.agent import vLLMRolloutAgent
    from vrag_rollout.verify.saved_batch import save_rollout

    search_only = turn_regex("tags", one_of(sorted(SAMPLE_FACTS)), DEMO_MAX_PAGE, answer=False, fetch=False)
    config = demo_config(**{**band(processor, args.band, args.page_tokens), **overrides},
                         retriever_fixtures=str(FIXTURES), n=args.n, max_turns=turns,
                         response_length=args.response_length, max_images_per_sample=args.images,
                         action_regex=search_only, first_turn_action_regex=None)
    agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm)
    questions = (demo_questions() * args.prompts)[: args.prompts]
    prompts = demo_prompts(processor.tokenizer, processor, questions, config)
    started = time.perf_counter()
    output = agent.generate_sequences(prompts)
    wall = time.perf_counter() - started
    result = measure(output, processor.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    result["wall s"] = wall
    result["batch KB"] = len(pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)) / 1024
    result["images KB"] = len(pickle.dumps(output.non_tensor_batch["multi_modal_data"],
                                           protocol=pickle.HIGHEST_PROTOCOL)) / 1024
    path = folder / f"t{turns}-{len(os.listdir(folder))}.pt"
    save_rollout(output, path, processor=processor, model_path=model_dir, config=agent.config)
    result["saved KB"] = path.stat().st_size / 1024
    if args.check:
        from vrag_rollout.verify.check import check_batch
        from vrag_rollout.verify.saved_batch import load_rollout

        report = check_batch(load_rollout(path), model_dir)
        kinds = Counter(failure.check for failure in report.failures)
        result["check"] = "PASS" if report.ok else "FAIL " + ",".join(f"{k}:{v}" for k, v in sorted(kinds.items()))
    return result, agent.inference_engine


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", default="4,8,16", help="max turns, comma separated")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--band", choices=("real", "demo"), default="real")
    parser.add_argument("--page-tokens", default="256,384", help="real band: min,max visual tokens of a page")
    parser.add_argument("--thumb-tokens", type=int, default=64, help="`thumbs`: visual tokens of a search thumbnail")
    parser.add_argument("--budget", type=int, default=2048, help="`budget`: visual tokens per episode")
    parser.add_argument("--response-length", type=int, default=16384)
    parser.add_argument("--images", type=int, default=40, help="images one sample may hold")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--check", action="store_true", help="run the checker (no forward) on every batch")
    args = parser.parse_args()
    args.page_tokens = tuple(int(x) for x in args.page_tokens.split(","))
    turn_counts = [int(x) for x in args.turns.split(",")]
    settings = args.settings.split(",")

    import torch
    from transformers import AutoProcessor

    from vrag_rollout.devkit.demo import demo_model
    from vrag_rollout.engine.llm import SAMPLED_LOGPROBS_MODE, configure_cpu_defaults, create_llm

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    configure_cpu_defaults()
    total = time.perf_counter()
    model_dir, _ = demo_model("qwen2-vl")
    processor = AutoProcessor.from_pretrained(model_dir)
    ip = processor.image_processor
    unit = (int(ip.patch_size) * int(ip.merge_size)) ** 2
    llm = create_llm(model=str(model_dir), dtype="float32", max_model_len=384 + args.response_length,
                     max_num_batched_tokens=384 + args.response_length, enforce_eager=True,
                     limit_mm_per_prompt={"image": args.images, "video": 0}, seed=0,
                     logprobs_mode=SAMPLED_LOGPROBS_MODE, kv_cache_memory_bytes=512 * 2**20)
    page = band(processor, args.band, args.page_tokens)
    print(f"tiny Qwen2-VL on vLLM (CPU), {args.prompts} prompts x n={args.n}, search-only grammar (2 pages a turn); "
          f"page band {page['page_min_pixels'] // unit}-{page['page_max_pixels'] // unit} visual tokens; "
          f"thumbs {args.thumb_tokens} tokens, budget {args.budget} tokens/episode, keep2: last 2 turns' images")
    results: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        _, llm = run_one(model_dir, processor, llm, 2, {}, args, Path(folder))  # warm-up: not measured
        for turns in turn_counts:
            for name in settings:
                results[turns, name], llm = run_one(model_dir, processor, llm, turns,
                                                    setting_overrides(name, unit, args), args, Path(folder))

    head = f"{'turns':>5} {'setting':<12}" + "".join(f" {c:>13}" for c in COLUMNS) + "  endings"
    print("\n" + head + ("  check" if args.check else ""))
    for turns in turn_counts:
        for name in settings:
            r = results[turns, name]
            line = f"{turns:>5} {name:<12}" + "".join(f" {fmt(r[c]):>13}" for c in COLUMNS)
            line += f"  {','.join(r['reasons'])} (turns {r['turns']:.1f})"
            print(line + (f"  {r['check']}" if args.check else ""))
    if "none" in settings:
        print(f"\nratio to `none` at the same turn count{'':>3}" + "".join(f" {c:>13}" for c in COLUMNS))
        for turns in turn_counts:
            base = results[turns, "none"]
            for name in settings:
                if name == "none":
                    continue
                r = results[turns, name]
                print(f"{turns:>5} {name:<36}" + "".join(
                    f" {r[c] / base[c] if base[c] else float('nan'):>12.2f}x" for c in COLUMNS))
    print(f"\ntotal {time.perf_counter() - total:.0f} s (engine start included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
