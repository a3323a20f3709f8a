"""Run the VRAG agent loop inside verl's own worker on this CPU and save verl's batch.

    .venv/bin/python scripts/check_verl.py --out verl_batch.pt [--family qwen3-vl] [--action-format tool_call]
    .venv/bin/vrag-rollout check verl_batch.pt --forward

What runs: the family's tiny model on the CPU build of vLLM, the sample corpus's index served by
`vrag-retriever` on loopback (real HTTP retrieval), and verl 0.9.1's `AgentLoopWorker`
(`vrag_rollout.integrations.verl.local`, built without Ray) running `vrag_agent` on the demo
questions, n samples each; verl's postprocessing makes the DataProto it would train on, which is
saved with verl's own `DataProto.save_to_disk` and then checked with the project's `check` (and
its forward oracle unless `--grammar` made the logprobs those of a constrained distribution).

`--grammar` (the demo's: every episode retrieves first, so pages are shown) or, by default,
free sampling (no grammar: the forward check compares every sampled token's logprob with the
family's own forward pass; the tiny random model then seldom writes an action).
Exits 1 when the check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import asyncio
import sys
import time
from contextlib import ExitStack
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where to save verl's DataProto (save_to_disk)")
    parser.add_argument("--family", default="qwen2-vl", help="tiny model family")
    parser.add_argument("--action-format", choices=["tags", "tool_call"], default="tags", help="action format")
    parser.add_argument("--questions", type=int, default=6, help="demo questions")
    parser.add_argument("--n", type=int, default=2, help="samples per question (adjacent rows, as verl repeats them)")
    parser.add_argument("--grammar", action="store_true", help="sample under the demo grammar (pages shown)")
    args = parser.parse_args(argv)

    from transformers import AutoProcessor

    from retriever_server.api.testing import serve_in_thread
    from vrag_rollout.devkit.demo import cache_dir, demo_config, demo_model, demo_page_band, demo_questions, prepare_index
    from vrag_rollout.engine.llm import build_llm, configure_cpu_defaults
    from vrag_rollout.integrations.verl.local import local_worker, prompt_rows
    from vrag_rollout.verify.check import run_check

    configure_cpu_defaults()
    model_dir, family = demo_model(args.family)
    processor = AutoProcessor.from_pretrained(model_dir)
    grammar = {} if args.grammar else {"action_regex": None, "first_turn_action_regex": None}
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(prepare_index(cache_dir())))
        config = demo_config(**demo_page_band(processor), retriever_url=url, action_format=args.action_format,
                             n=1, **grammar)
        llm = build_llm(str(model_dir), config, config.images_per_sample())
        settings = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
        worker = local_worker(str(model_dir), llm, settings)
        rows = prompt_rows(demo_questions()[: args.questions], args.action_format, n=args.n)
        started = time.perf_counter()
        batch = asyncio.run(worker.generate_sequences(rows))
        print(f"verl worker: {len(batch)} trajectories of {family} ({args.action_format}, "
              f"{'grammar' if args.grammar else 'free sampling'}) in {time.perf_counter() - started:.1f}s, "
              f"{worker.llm_client.calls} engine calls")
    columns = batch.non_tensor_batch
    for row in range(len(batch)):
        pages = [page for turn in columns["page_ids"][row] for page in turn]
        print(f"  {row:>2} {columns['doc_id'][row]:<14} {columns['termination_reason'][row]:<10} "
              f"turns {columns['__num_turns__'][row]}  pages {pages}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    batch.save_to_disk(str(args.out))
    print(f"saved verl's DataProto to {args.out}")
    report = run_check(args.out, model_dir, forward=True)
    print(report.human())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
