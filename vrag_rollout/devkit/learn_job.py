"""`vrag-rollout learn`: the closed GRPO loop (`training/learn.py`) wired to the real pieces on CPU.

The tiny model of the demo (or a local checkpoint), its processor, the HF policy loaded from the
same directory in fp32, `vLLMRolloutAgent` with `calculate_log_probs=True` on the demo's config
on the find-the-page task (`learn_task.py`: its questions, ground truths and action grammar), the
embedded retriever on the sample corpus (or a running one, or recorded fixtures), the project's
reward, verl's GRPO step with the KL to the initial weights measured, and after every step
`engine.weights.sync_weights` on the engine the rollout uses, with `logprob_gap` before the sync
(how far the update moved the policy) and after it (a gap over 1e-3, or a movement too small for
that check to mean anything, fails the run). A progress bar and one line per step report reward and gap.

Outputs in `out_dir`: `metrics.jsonl` (one line per step), `reward.png` (the curve), `final/` (the
trained model in Hugging Face format) and `eval.pt` (a batch the final weights rolled out, saved
with its rollout logprobs, which the forward check verifies against `final/`).

`run_learn` takes an already running engine (`llm=`) and a retriever client (`retriever=`) so a
test can run the same wiring on its shared engine; by default it builds both.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from .learn_checkpoints import CHECKPOINTS, checkpoint_step, latest_checkpoint, restore


def check_settings(*, steps: int, batch_size: int, n: int, max_turns: int, response_length: int,
                   temperature: float, lr: float, data: Optional[Path] = None, index: Optional[Path] = None,
                   out_dir: Optional[Path] = None, resume: bool = False, save_every: int = 0) -> None:
    """Refuse settings the loop cannot learn from, before any model or engine is loaded."""
    from .learn_task import task_facts

    if save_every < 0:
        raise ValueError(f"save_every must be >= 0, got {save_every}")
    if resume:
        found = latest_checkpoint(out_dir) if out_dir is not None else None
        if found is None:
            raise ValueError(f"--resume: no checkpoint under {Path(out_dir or '.') / CHECKPOINTS} (a run saves them "
                             "with --save-every N)")
        step = checkpoint_step(found)
        if step >= steps:
            raise ValueError(f"--resume: {found} is step {step}, and the run has {steps} steps: raise --steps")

    problems = [f"{name} must be >= {low}, got {value}" for name, value, low in
                (("steps", steps, 1), ("batch_size", batch_size, 1), ("max_turns", max_turns, 1),
                 ("response_length", response_length, 1)) if value < low]
    if data is not None and not Path(data).is_file():
        problems.append(f"--data {data}: no such file (write one with `vrag-rollout convert-dataset`)")
    elif data is not None and not _is_parquet(Path(data)):
        problems.append(f"--data {data}: not a parquet file; a question file is converted first: "
                        f"`vrag-rollout convert-dataset {data} --out train.parquet`, then --data train.parquet")
    if index is not None and not (Path(index) / "manifest.json").is_file():
        problems.append(f"--index {index}: not a retriever index (no manifest.json; build one with `vrag-retriever index`)")
    if data is None and batch_size > len(task_facts()):
        problems.append(f"batch_size must be <= {len(task_facts())} (the find-the-page task's questions), got {batch_size}")
    if n < 2:
        problems.append(f"n must be >= 2 (GRPO compares the samples of a question with each other), got {n}")
    if not temperature > 0:
        problems.append(f"temperature must be > 0, got {temperature}")
    if not lr > 0:
        problems.append(f"lr must be > 0, got {lr}")
    if problems:
        raise ValueError("vrag-rollout learn: " + "; ".join(problems))


def _is_parquet(path: Path) -> bool:
    """Whether the file starts with parquet's magic bytes (what convert-dataset writes)."""
    with open(path, "rb") as file:
        return file.read(4) == b"PAR1"


def learn_questions(data: Optional[Path], batch_size: int, action_format: str = "tags") -> tuple[list, list, Optional[list]]:
    """(prompt samples, ground truths, recorded page counts or None): the first `batch_size` rows
    of `data` (a converted dataset), or without it the find-the-page task's questions."""
    from .learn_task import task_instructions, task_questions
    from .rollout_job import page_counts_of, read_job_questions

    if data is None:
        samples, truths = task_questions(batch_size, task_instructions(action_format))
        return samples, truths, None
    samples, truths = read_job_questions(Path(data), batch_size)
    return samples, truths, page_counts_of(Path(data), batch_size)


def learn_grammar(data: Optional[Path], samples: list, page_counts: Optional[list], index: Optional[Path],
                  action_format: str, acts: bool) -> dict:
    """The action grammar's config fields: the find-the-page task's own; on your questions, the
    acting grammar `rollout` gives a tiny model (search, fetch or answer; a first turn that
    retrieves) when `acts`, else none (a trained checkpoint writes its own actions)."""
    from .demo import FREE_QUERY, acting_grammar, in_corpus_scope
    from .learn_task import task_regex
    from .rollout_job import grammar_max_page

    if data is None:
        return {"action_regex": task_regex(action_format)}
    if not acts:
        return {"action_regex": None}
    return acting_grammar(action_format, FREE_QUERY, grammar_max_page(page_counts, index), in_corpus_scope(samples))


DEFAULTS = dict(steps=40, batch_size=3, n=8, max_turns=3, response_length=256, temperature=1.0, lr=1e-3)
FINAL_DIR = "final"
EVAL_FILE = "eval.pt"
PLOT_FILE = "reward.png"


def run_learn(out_dir: Path, *, steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"],
              n: int = DEFAULTS["n"], max_turns: int = DEFAULTS["max_turns"],
              response_length: int = DEFAULTS["response_length"], temperature: float = DEFAULTS["temperature"],
              lr: float = DEFAULTS["lr"], seed: int = 0, family: Optional[str] = None, model: Optional[str] = None,
              model_dir: Optional[Path] = None, processor: Any = None, llm: Any = None, retriever: Any = None,
              retriever_url: Optional[str] = None, fixtures: Optional[str] = None, action_format: str = "tags",
              data: Optional[Path] = None, index: Optional[Path] = None, evaluate: bool = True,
              progress: bool = True, retriever_preflight: str = "fail", guard: str = "drop",
              grammar: Optional[bool] = None, save_every: int = 0, resume: bool = False,
              estimator: Optional[str] = None, turn_rewards: Optional[str] = None, task: str = "page",
              context: Optional[dict] = None) -> dict:
    """Run the loop and write its outputs (module docstring); returns {"records", "summary",
    "hf_model", "llm", "agent", "model_dir", "processor", "final_dir", "eval_path", "report",
    "questions", "truths"}. `estimator` (grpo|turn|gigpo) or `turn_rewards` (off|retrieval|on)
    given: turn-level credit (`training/turn_credit.py`), its metrics in each line; `task`
    "two-pages": the credit task (`credit_task.py`) instead of find-the-page. `context`: the
    rollout's visual budgets and context policy (`AgentRolloutConfig` fields such as
    `context_keep_pages`; README "Context budget"): an edited episode trains as several rows,
    weighed as one (`training/segments.py`)."""
    check_settings(steps=steps, batch_size=batch_size, n=n, max_turns=max_turns,
                   response_length=response_length, temperature=temperature, lr=lr, data=data, index=index,
                   out_dir=out_dir, resume=resume, save_every=save_every)
    import copy

    import torch
    from tqdm import tqdm
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..engine.llm import configure_cpu_defaults
    from ..engine import weights
    from ..rollout.agent import vLLMRolloutAgent
    from ..training.grpo import response_log_probs
    from ..training.learn import episode_scores, learn, no_signal, reward_summary
    from ..training.turn_credit import Credit
    from ..verify.drift import batch_drift
    from ..verify.guard import LiveGuard, guarded
    from .demo import cache_dir, demo_config, demo_model, demo_page_band, demo_prompts, prepare_index
    from .learn_checkpoints import TensorBoardLog, save_checkpoint
    from .learn_report import plot_rewards, summary_line

    configure_cpu_defaults()
    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    if model_dir is None:
        model_dir, _family = demo_model(family, model)
    processor = processor or AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    hf_model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    initial = copy.deepcopy(hf_model).requires_grad_(False)  # the KL reference: the weights the run started from
    with ExitStack() as stack:
        if retriever is None and retriever_url is None and fixtures is None:
            from retriever_server.api.testing import serve_in_thread

            retriever_url = stack.enter_context(serve_in_thread(Path(index) if index else prepare_index(cache_dir())))
        samples, truths, counts = learn_questions(data, batch_size, action_format)
        if task != "page":  # the credit task (credit_task.py): its questions and its grammar
            from .credit_task import credit_questions, credit_regex

            samples, truths = credit_questions(batch_size)
        config = demo_config(n=n, max_turns=max_turns, response_length=response_length, temperature=temperature,
                             seed=seed, calculate_log_probs=True, action_format=action_format,
                             **(learn_grammar(data, samples, counts, index, action_format,
                                              acts=(model is None) if grammar is None else grammar)
                                if task == "page" else {"action_regex": credit_regex(action_format)}),
                             retriever_url=retriever_url or "http://127.0.0.1:8002", retriever_fixtures=fixtures,
                             retriever_preflight=retriever_preflight, **demo_page_band(processor), **(context or {}))
        agent = vLLMRolloutAgent(str(model_dir), config, tokenizer, processor, inference_engine=llm,
                                 retriever=retriever)
        engine = agent.inference_engine
        prompts = demo_prompts(tokenizer, processor, samples, config)
        rollout = agent.generate_sequences
        guard_config = config.updated(guard=guard, guard_samples_dir=str(out_dir / "guard_bad_samples"))
        live = LiveGuard.from_config(model_dir, guard_config, processor=processor)
        if live is not None:  # every batch inspected before it reaches the update (verify/guard.py)
            rollout = guarded(rollout, live)

        def learn_drift(batch: Any, old_log_probs: Any) -> dict:
            found = batch_drift(batch, old_log_probs, "loss_mask")
            return {} if found is None else {**found.metrics(), "guard/drift/worst": found.worst}

        def sync(policy: Any) -> None:
            weights.sync_weights(engine, policy)

        def probe(policy: Any) -> float:
            return weights.logprob_gap(engine, policy, processor)

        def reference(batch: Any) -> Any:
            with torch.no_grad():
                return response_log_probs(initial, processor, batch, temperature)

        optimizer = torch.optim.AdamW(hf_model.parameters(), lr=lr, weight_decay=0.0)
        start_step = 1
        if resume:
            start_step = resumed_step(out_dir, steps, hf_model, optimizer) + 1
            sync(hf_model)  # the engine serves the checkpoint's weights from the first rollout on
        board = TensorBoardLog(out_dir)
        stack.callback(board.close)
        # disable=None: no bar when the output is not a terminal (piped, a log file); the step lines stay
        bar = stack.enter_context(tqdm(total=steps, initial=start_step - 1, desc="learn", unit="step",
                                       disable=None if progress else True))

        def on_step(record: dict) -> None:
            bar.update(1)
            board(record)
            if save_every and (record["step"] % save_every == 0 or record["step"] == steps):
                saved = save_checkpoint(out_dir, record["step"], hf_model, optimizer, processor)
                bar.write(f"saved {saved} (resume with --resume)")
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", gap=f"{record['logprob_gap_max']:.1e}")
            if (why := no_signal([record])) is not None:
                bar.write(f"warning: step {record['step']}: {why}")
            bar.write(f"step {record['step']:>3}/{steps} reward {record['reward_mean']:.3f} "
                      f"(accuracy {record['reward_accuracy']:.2f}, retrieval {record['reward_retrieval']:.2f}) "
                      f"kl {record['kl_to_initial']:.4f} moved {record['policy_movement']:.1e} "
                      f"post-sync logprob gap {record['logprob_gap_max']:.1e}")
            if record["guard_bad"]:
                bar.write(f"warning: step {record['step']}: the guard found {record['guard_bad']:.0f} bad samples "
                          f"(dropped from the loss: {record['guard_dropped']:.0f})")

        earlier = earlier_records(out_dir, start_step)
        records = learn(
            prompts, rollout=rollout, sync=sync, probe=probe, reference=reference,
            reward=lambda batch: episode_scores(batch, tokenizer, truths),
            hf_model=hf_model, optimizer=optimizer,
            processor=processor, n=n, temperature=temperature, steps=steps, out_dir=out_dir, on_step=on_step,
            drift=learn_drift, start_step=start_step,
            credit=None if estimator is None and turn_rewards is None else Credit(
                estimator or "grpo", turn_rewards or "off", tokenizer, truths),
        )
        records = earlier + records
        bar.close()
        summary = reward_summary(records)
        print(summary_line(summary))
        if (why := no_signal(records)) is not None:
            print(f"warning: the run learned nothing: {why}")
        task = "the find-the-page task" if data is None else Path(data).name
        plot_rewards(records, out_dir / PLOT_FILE,
                     title=f"GRPO on {task} ({Path(model_dir).name}, {action_format}, n={n}, lr={lr:g})")
        final_dir = save_final(hf_model, processor, model_dir, out_dir / FINAL_DIR)
        eval_path = report = None
        if evaluate:
            free = vLLMRolloutAgent(str(model_dir), replace(config, action_regex=None, first_turn_action_regex=None), tokenizer, processor,
                                    inference_engine=engine, retriever=agent.retriever)
            eval_path, report = evaluate_final(free, prompts, processor, final_dir, out_dir / EVAL_FILE, truths)
    print(f"wrote {out_dir / 'metrics.jsonl'}, {out_dir / PLOT_FILE}, {final_dir}"
          + (f", {eval_path}" if eval_path else ""))
    return {"records": records, "summary": summary, "hf_model": hf_model, "llm": engine, "agent": agent,
            "model_dir": Path(model_dir), "processor": processor, "final_dir": final_dir, "eval_path": eval_path,
            "report": report, "questions": [sample.question for sample in samples], "truths": truths}


def resumed_step(out_dir: Path, steps: int, hf_model: Any, optimizer: Any) -> int:
    """The latest checkpoint's weights and optimizer state restored; the step it was saved after
    (`LearnError` without one, or when it already reached `steps`)."""
    from ..training.learn import LearnError

    found = latest_checkpoint(out_dir)
    if found is None or checkpoint_step(found) >= steps:  # check_settings says why, before anything loads
        raise LearnError(f"--resume: no checkpoint before step {steps} under {Path(out_dir) / CHECKPOINTS}")
    step = restore(found, hf_model, optimizer)
    print(f"resuming from {found}: steps {step + 1} to {steps}")
    return step


def earlier_records(out_dir: Path, start_step: int) -> list:
    """A resumed run's metrics lines before `start_step` (for its summary and plot)."""
    from ..training.learn import METRICS_FILE, steps_before

    return steps_before(Path(out_dir) / METRICS_FILE, start_step) if start_step > 1 else []


def save_final(hf_model: Any, processor: Any, model_dir: Path, final_dir: Path) -> Path:
    """The trained model in Hugging Face format with the processor (tokenizer, chat template, image
    processor) of the model it started from, so vLLM, transformers and the demo load it."""
    final_dir.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(final_dir)
    processor.save_pretrained(final_dir)
    return final_dir


def evaluate_final(agent: Any, prompts: Any, processor: Any, final_dir: Path, path: Path, truths: list) -> tuple:
    """One batch rolled out by the engine on the final weights (synced and checked by the last step),
    saved with its rollout logprobs, then checked against `final_dir` with the forward oracle.

    `agent` samples without the action grammar: a grammar renormalises the distribution over the
    tokens it allows, which a forward pass cannot reproduce, so `check --forward` only reports the
    gap of a grammar-constrained batch; free sampling makes the forward check exact (1e-3), and so
    able to tell the final weights from any others."""
    from ..verify.check import run_check
    from ..verify.saved_batch import save_rollout

    from .demo import add_truths_and_rewards

    output = agent.generate_sequences(prompts)
    add_truths_and_rewards(output, processor.tokenizer, truths)  # for the viewer and other readers
    save_rollout(output, path, processor=processor, model_path=final_dir, config=agent.config)
    report = run_check(path, final_dir, forward=True)
    print(report.human())
    if not report.ok:
        raise RuntimeError(f"the final model's own batch fails the check against it: {path} vs {final_dir}")
    return path, report
