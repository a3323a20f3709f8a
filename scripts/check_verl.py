"""Run the VRAG agent loop inside verl's own worker on this CPU and save verl's batch.

    .venv/bin/python scripts/check_verl.py --out verl_batch.pt [--family qwen3-vl] [--action-format tool_call]
    .venv/bin/vrag-rollout check verl_batch.pt --forward

What runs: the family's released-shape tiny model (docs/tiny-models.md) on the CPU build of vLLM,
the sample corpus's index served by `vrag-retriever` on loopback (real HTTP retrieval), and verl
0.9.1's `AgentLoopWorker` (`vrag_rollout.integrations.verl.local`, built without Ray) running
`vrag_agent` on the demo questions, n samples each; verl's postprocessing makes the DataProto it would train on, which is
saved with verl's own `DataProto.save_to_disk` and then checked with the project's `check` (and
its forward oracle unless `--grammar` made the logprobs those of a constrained distribution).

`--grammar` (the demo's: every episode retrieves first, so pages are shown) or, by default,
free sampling (no grammar: the forward check compares every sampled token's logprob with the
family's own forward pass; the tiny random model then seldom writes an action).
Exits 1 when the check fails.

The live guard (`integrations/verl/guard.py`) runs where a job runs it: `local.py` builds verl's
worker as the guard's `GuardedAgentLoopWorker`, whose `_postprocess` (verl's own, then the guard)
makes the batch; `--guard MODE` sets its mode (default drop), and the run's first bad samples go to
`guard_bad_samples/` beside `--out` (`vrag-rollout view` opens them).

`--plant DEFECT` (repeatable, or `all`; implies `--grammar`, so episodes show pages) is fault
injection inside that path: `PlantingWorker` keeps the trajectories the engine produced, then for
each defect runs verl's `_postprocess` on them again and plants the defect into the batch it built
(verl's positions, masks, images) just before the guard inspects it. No engine runs again. Defects:
`devkit/planted_defects.py` (those of tests/verify/test_guard.py: positions shifted by one after a
response image, an observation token in the loss, an image's pad run one token short, a GRPO
group's sample copied over the next, tokens kept past the stop, a vision token sampled). The mrope comparison runs on
every sample here (`guard_positions_fraction` 1.0; a job's default compares 1/8 of them, drawn per
batch). It prints, per defect, the planted sample, the samples the guard found bad (and by which
check), and the rows whose masks were zeroed; under `fail`, the error that stopped the step. Exits
1 unless every defect was caught at exactly the planted sample (drop: only its masks zeroed; warn:
none zeroed; fail: the step stopped).
"""

from __future__ import annotations

import argparse
import dataclasses
import asyncio
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import torch

from vrag_rollout.devkit.planted_defects import DEFECTS as PLANTS
from vrag_rollout.devkit.planted_defects import plant as plant_defect


def planting_worker_class() -> type:
    from vrag_rollout.integrations.verl.guard import GuardedAgentLoopWorker

    class PlantingWorker(GuardedAgentLoopWorker):
        """Fault injection between verl's `_postprocess` and the guard (the module docstring)."""

        plant: Optional[str] = None
        planted: Optional[int] = None
        recorded: Optional[tuple] = None
        before_guard: Optional[torch.Tensor] = None

        def _postprocess(self, inputs: list, input_non_tensor_batch: Optional[dict] = None, validate: bool = False):
            self.recorded = (inputs, input_non_tensor_batch, validate)
            return super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)

        def guard_batch(self, batch: Any) -> dict:
            self.planted = plant_defect(self.plant, batch, self.processor, set()) if self.plant else None
            self.before_guard = batch.batch["response_mask"].clone()  # what drop acts on
            return super().guard_batch(batch)

        def replay(self, plant: str) -> Any:
            """verl's postprocessing and the guard again on the recorded trajectories, `plant`
            planted in between; the row columns are copied (a plant writes into its batch's)."""
            inputs, columns, validate = self.recorded
            self.plant = plant
            try:
                return self._postprocess(inputs, {k: v.copy() for k, v in (columns or {}).items()}, validate)
            finally:
                self.plant = None

    return PlantingWorker


def plant_outcome(worker: Any, plant: str, mode: str) -> tuple[bool, str]:
    """Run `plant` through the worker; (as expected, the line to print)."""
    from vrag_rollout.verify.guard import GUARD_COLUMN, GuardFailure

    try:
        batch = worker.replay(plant)
    except GuardFailure as error:
        message = str(error)
        return mode == "fail" and f"sample {worker.planted}" in message, \
            f"planted in sample {worker.planted}: the step stopped: {message[:160]}"
    verdicts = batch.non_tensor_batch[GUARD_COLUMN]
    bad = [row for row, verdict in enumerate(verdicts) if verdict["bad"]]
    checks = sorted({name[4:] for row in bad for name in verdicts[row] if name.startswith("bad/")})
    zeroed = [row for row in range(len(batch)) if not batch.batch["response_mask"][row].any()]
    expected = bad == [worker.planted] and zeroed == ([worker.planted] if mode == "drop" else []) and mode != "fail"
    return expected, f"planted in sample {worker.planted}: guard bad {bad} ({', '.join(checks)}), masks zeroed {zeroed}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where to save verl's DataProto (save_to_disk)")
    parser.add_argument("--family", default="qwen2-vl", help="tiny model family")
    parser.add_argument("--action-format", choices=["tags", "tool_call"], default="tags", help="action format")
    parser.add_argument("--questions", type=int, default=6, help="demo questions")
    parser.add_argument("--n", type=int, default=2, help="samples per question (adjacent rows, as verl repeats them)")
    parser.add_argument("--grammar", action="store_true", help="sample under the demo grammar (pages shown)")
    parser.add_argument("--guard", choices=["fail", "drop", "warn", "off"], default="drop", help="the live guard's mode")
    parser.add_argument("--plant", action="append", choices=[*PLANTS, "all"], default=[],
                        help="plant this defect in verl's batch before the guard (repeatable; implies --grammar)")
    args = parser.parse_args(argv)
    plants = list(PLANTS) if "all" in args.plant else list(dict.fromkeys(args.plant))
    if plants and args.guard == "off":
        parser.error("--plant needs the guard on (--guard fail, drop or warn)")
    args.grammar = args.grammar or bool(plants)

    from transformers import AutoProcessor

    from retriever_server.api.testing import serve_in_thread
    from vrag_rollout.devkit.demo import cache_dir, demo_config, demo_model, demo_page_band, demo_questions, prepare_index
    from vrag_rollout.engine.llm import build_llm, configure_cpu_defaults
    from vrag_rollout.integrations.verl.local import local_worker, prompt_rows
    from vrag_rollout.verify.check import run_check
    from vrag_rollout.verify.guard import GUARD_COLUMN, column_metrics

    configure_cpu_defaults()
    model_dir, family = demo_model(args.family, shape="released")  # verl reads the released ids by value
    processor = AutoProcessor.from_pretrained(model_dir)
    grammar = {} if args.grammar else {"action_regex": None, "first_turn_action_regex": None}
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(prepare_index(cache_dir())))
        config = demo_config(**demo_page_band(processor), retriever_url=url, action_format=args.action_format,
                             n=1, guard=args.guard, guard_samples_dir=str(args.out.parent / "guard_bad_samples"),
                             **({"guard_positions_fraction": 1.0} if plants else {}), **grammar)
        llm = build_llm(str(model_dir), config, config.images_per_sample())
        settings = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
        worker = local_worker(str(model_dir), llm, settings, planting_worker_class() if plants else None)
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
    if GUARD_COLUMN in columns:
        counts = column_metrics(columns[GUARD_COLUMN])
        print(f"guard ({args.guard}) on verl's batch: " + ", ".join(f"{k} {v:g}" for k, v in counts.items()))
    caught = True
    if plants:
        print(f"planted defects (guard {args.guard}, each into verl's batch of the same trajectories):")
        for plant in plants:
            expected, line = plant_outcome(worker, plant, args.guard)
            caught &= expected
            print(f"  {plant:<24} {line}  {'OK' if expected else 'UNEXPECTED'}")
        if worker.live_guard().samples is not None and worker.live_guard().samples.paths:
            print(f"bad samples saved: {', '.join(str(p) for p in worker.live_guard().samples.paths)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    batch.save_to_disk(str(args.out))
    print(f"saved verl's DataProto to {args.out}")
    report = run_check(args.out, model_dir, forward=True)
    print(report.human())
    return 0 if report.ok and caught else 1


if __name__ == "__main__":
    sys.exit(main())
