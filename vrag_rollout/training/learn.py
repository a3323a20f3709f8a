"""The closed GRPO loop: roll out, score, update the HF model, sync it into the engine, check.

Contract:

- `learn(prompts, rollout=, sync=, reward=, reference=, hf_model=, optimizer=, processor=, n=,
  temperature=, steps=, out_dir=)` runs `steps` steps; each step
  1. `batch = rollout(prompts)`: n samples per prompt on adjacent rows, with the rollout's
     `loss_mask` and the engine's `logit_bias` (what `vLLMRolloutAgent.generate_sequences` returns);
  2. `scores = reward(batch)`: one dict per row with `overall` (the scalar GRPO learns from) and
     the reward's parts (`episode_scores` scores with `core/reward.py`);
  3. `grpo_step` (`training/grpo.py`: verl's advantages and loss) updates `hf_model` in place, and
     measures verl's low-variance KL of the sampling policy to `reference(batch)`, the initial
     model's log-probs of the same tokens;
  4. `movement = probe(hf_model)` before the sync: `probe` is the largest logprob gap between the
     engine and a transformers forward pass of `hf_model` on fixed probe prompts, and the engine
     still serves the old weights, so this is exactly what the post-sync check would read if the
     sync did nothing; then `sync(hf_model)` pushes the new weights into the engine the rollout
     uses and `gap = probe(hf_model)`. The run fails (`LearnError`, after the step's line is
     written) when the gap is above `gap_tolerance` (1e-3), or when an update that had a gradient
     moved the policy by less than `MOVEMENT_FACTOR` times the tolerance: such a check could not
     tell a missing sync from a done one (a learning rate too small for it, e.g. 1e-6 on the tiny
     model). A `sync` or `probe` that raises fails the run as it is;
  5. appends one JSON line to `out_dir/metrics.jsonl` with `STEP_FIELDS` (`step` is 1-based; the
     `reward_*` parts are means over the batch, `pages_shown_mean` the pages the retriever showed an
     episode, `policy_movement` the pre-sync gap of step 4, `seconds_*` the step's time split,
     `guard_*` the live guard's counts when the rollout is guarded, `verify/guard.py`; `drift_*`
     the largest per-turn gap between the update's old log-probs and the rollout's, and its turn,
     when `drift(batch, old_log_probs)` is given) and calls `on_step(record)`; `out_dir/guard.jsonl`
     gets the step's whole `guard/` metrics (per check, per turn, the worst samples). The files are
     rewritten from the start of a run (appended to from `start_step` when one is continued) and
     flushed after every line.
- The loop knows nothing of vLLM, the retriever or the agent (the layer rule: `training/` imports
  only `training/`, `core/` and the leaf modules); `devkit/learn_job.py` wires the real pieces
  (`vrag-rollout learn`).
- `episode_scores(batch, tokenizer, truths)` is the project's reward (`core.reward.compute_scores`)
  of each row: the whole decoded episode (sampled text and observations, as EasyR1's patched
  reward manager decodes it) against its prompt's ground truth (`truths[row // n]`: an answer
  string or a dict with `answer`, `doc_id`, `gold_pages`), with the row's `page_ids` column added
  so retrieval is scored.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ..core.reward import PARTS, compute_scores, shown_pages
from .grpo import actor_config, grpo_step
from .segments import last_rows, prompt_rows

STEP_FIELDS = ("step", "reward_mean", *(f"reward_{part}" for part in PARTS), "advantage_std", "loss", "grad_norm",
               "logprob_gap_max", "policy_movement", "kl_to_initial", "turns_mean", "pages_shown_mean",
               "seconds_rollout", "seconds_update", "seconds_sync", "guard_checked", "guard_bad", "guard_dropped",
               "drift_max", "drift_worst_turn")
CREDIT_FIELDS = ("estimator", "reward/turn/", "advantage/turn/")  # with `credit`: the estimator, per-turn metrics
GUARD_FILE = "guard.jsonl"
GAP_TOLERANCE = 1e-3  # the engine's SYNC_TOLERANCE (engine/weights.py), restated: training/ may not import engine/
# An update must move the probe's logprobs this many tolerances for the post-sync check to mean
# anything: a sync that did nothing leaves exactly the pre-sync gap (same prompts, seed and
# weights), so it then reads at least three times the tolerance, clear of a done one's (about 1e-6).
MOVEMENT_FACTOR = 3.0
METRICS_FILE = "metrics.jsonl"


class LearnError(RuntimeError):
    """A step of the loop failed: the engine does not serve the updated weights, or a bad value."""


# --- per-step bookkeeping (pure) -----------------------------------------------------------------

def episode_texts(batch: Any, tokenizer: Any) -> list[str]:
    """Each row's whole response (sampled and observed tokens, padding dropped), decoded."""
    tokens = batch.batch
    width = tokens["responses"].shape[1]
    used = tokens["attention_mask"][:, -width:].bool()
    return [tokenizer.decode(tokens["responses"][row][used[row]].tolist(), skip_special_tokens=True)
            for row in range(len(used))]


def row_ground_truth(truth: Any, page_ids: Any) -> Any:
    """The prompt's ground truth with the row's `page_ids` (a plain answer string stays as is)."""
    if isinstance(truth, str):
        return truth
    return {**dict(truth), "page_ids": shown_pages(page_ids)}


def episode_scores(batch: Any, tokenizer: Any, truths: Sequence[Any], **weights: float) -> list[dict]:
    """`core.reward`'s scores (`overall` and its parts) per row; `truths` has one entry per prompt
    (row // n; a segmented batch's row answers its episode's prompt). An episode's score is its
    last row's: that row holds every turn it sampled and every page it was shown."""
    episodes = len(last_rows(batch))  # a segmented batch has several rows an episode
    if not truths or episodes % len(truths):
        raise LearnError(f"{episodes} episodes are not a whole number of samples of {len(truths)} prompts")
    prompt_of = prompt_rows(batch, episodes // len(truths))
    pages = batch.non_tensor_batch.get("page_ids")
    inputs = [{"response": text, "response_length": 0,
               "ground_truth": row_ground_truth(truths[prompt_of[row]], None if pages is None else pages[row])}
              for row, text in enumerate(episode_texts(batch, tokenizer))]
    return [{key: float(value) for key, value in score.items()} for score in compute_scores(inputs, **weights)]


def turns_mean(batch: Any) -> float:
    turns = batch.non_tensor_batch.get("num_turns")
    turns = None if turns is None else [turns[row] for row in last_rows(batch)]
    return float(sum(int(t) for t in turns) / len(turns)) if turns is not None and len(turns) else 0.0


def pages_shown_mean(batch: Any) -> float:
    """Pages the retriever showed an episode (every page of every observation), batch mean."""
    pages = batch.non_tensor_batch.get("page_ids")
    if pages is None or not len(pages):
        return 0.0
    pages = [pages[row] for row in last_rows(batch)]
    return float(sum(sum(len(turn) for turn in shown_pages(row)) for row in pages) / len(pages))


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


def step_record(step: int, scores: Sequence[Mapping[str, float]], update: Mapping[str, float], gap: float,
                movement: float, batch: Any, seconds: Sequence[float], drift: Optional[Mapping[str, float]] = None) -> dict:
    """One metrics line, fields in `STEP_FIELDS` order (`check_record` validates it)."""
    return {"step": int(step), "reward_mean": mean([s["overall"] for s in scores]),
            **{f"reward_{part}": mean([s[part] for s in scores]) for part in PARTS},
            "advantage_std": float(update["advantage_std"]), "loss": float(update["loss"]),
            "grad_norm": float(update["grad_norm"]), "logprob_gap_max": float(gap),
            "policy_movement": float(movement), "kl_to_initial": float(update["kl_to_reference"]), "turns_mean": turns_mean(batch),
            "pages_shown_mean": pages_shown_mean(batch), "seconds_rollout": float(seconds[0]),
            "seconds_update": float(seconds[1]), "seconds_sync": float(seconds[2]),
            **guard_fields(batch), "drift_max": float((drift or {}).get("guard/drift/max", 0.0)),
            "drift_worst_turn": float((drift or {}).get("guard/drift/worst_turn", 0.0))}


def guard_fields(batch: Any) -> dict:
    """The live guard's counts of the step (`meta_info["guard"]`, set by a guarded rollout; 0 without one)."""
    found = (getattr(batch, "meta_info", None) or {}).get("guard") or {}
    return {f"guard_{name}": float(found.get(f"guard/{name}", 0.0)) for name in ("checked", "bad", "dropped")}


def check_record(record: dict, gap_tolerance: float = GAP_TOLERANCE) -> None:
    """Raise `LearnError` on a line with the wrong fields, a non-finite value, a gap over tolerance,
    or an update (one with a gradient) that moved the policy too little for the gap to prove a sync."""
    extra = tuple(record)[len(STEP_FIELDS):]
    if tuple(record)[:len(STEP_FIELDS)] != STEP_FIELDS or not all(key.startswith(CREDIT_FIELDS) for key in extra):
        raise LearnError(f"metrics line has fields {tuple(record)}, expected {STEP_FIELDS} (+ {CREDIT_FIELDS}...)")
    bad = [key for key, value in record.items() if key != "estimator" and not math.isfinite(value)]
    if bad:
        raise LearnError(f"step {record['step']}: non-finite {bad}: {record}")
    if not record["logprob_gap_max"] <= gap_tolerance:
        raise LearnError(f"step {record['step']}: the engine does not serve the updated weights: post-sync "
                         f"logprob gap {record['logprob_gap_max']:.3e} > {gap_tolerance:.0e}")
    needed = MOVEMENT_FACTOR * gap_tolerance
    if record["grad_norm"] > 0 and record["policy_movement"] < needed:
        raise LearnError(f"step {record['step']}: the update moved the policy by only "
                         f"{record['policy_movement']:.2e} (the engine's old weights against the new ones on the "
                         f"probe prompts), under {needed:.0e}: the post-sync check (tolerance {gap_tolerance:.0e}) "
                         "could not tell a missing weight sync from a done one. Raise the learning rate (--lr)")


def no_signal(records: Sequence[Mapping[str, float]]) -> Optional[str]:
    """Why none of `records`' steps could teach the policy anything, or None when one could: GRPO
    learns from reward differences within a question's samples, and a step whose every group
    earned one reward has advantages of 0 (`advantage_std` 0), so no gradient. The message says
    what the reward's parts and the episodes show, and the likeliest cause they point to."""
    if not records or any(record["advantage_std"] > 0 for record in records):
        return None
    steps = "no step had any" if len(records) > 1 else "the step had no"
    shown = {part: mean([float(r.get(f"reward_{part}", 0.0)) for r in records]) for part in PARTS}
    turns = mean([float(r.get("turns_mean", 0.0)) for r in records])
    pages = mean([float(r.get("pages_shown_mean", 0.0)) for r in records])
    parts = ", ".join(f"{part} {value:.2f}" for part, value in shown.items())
    if pages == 0 and turns <= 1:
        cause = ("no episode searched or fetched a page: the policy never wrote an action (a tiny random model "
                 "acts only under the action grammar: --grammar)")
    elif not any(shown.values()):
        cause = ("every part is 0 though the episodes acted: no answer matched and no gold page was shown; check "
                 "that the answers and the documents match the data")
    else:
        cause = ("every sample of a question scored the same parts: more samples (--n) or a higher temperature "
                 "make them differ")
    return (f"{steps} reward difference between the samples of a question (advantage_std 0), so GRPO "
            f"had nothing to learn from. Reward parts (means): {parts}; {turns:.1f} turns and {pages:.1f} pages "
            f"shown per episode: {cause}")


def reward_summary(records: Sequence[Mapping[str, float]], window: Optional[int] = None) -> dict:
    """Mean reward over the first and the last `window` steps (a quarter of the run, at least one
    step, by default) and the gain between them: the curve in three numbers."""
    if not records:
        raise ValueError("no steps to summarise")
    window = max(1, len(records) // 4) if window is None else window
    first = mean([r["reward_mean"] for r in records[:window]])
    last = mean([r["reward_mean"] for r in records[-window:]])
    return {"steps": len(records), "window": window, "first": first, "last": last, "gain": last - first}


# --- the loop ------------------------------------------------------------------------------------

def learn(prompts: Any, *, rollout: Callable[[Any], Any], sync: Callable[[Any], Any], probe: Callable[[Any], float],
          reward: Callable[[Any], Sequence[Mapping[str, float]]], reference: Callable[[Any], Any], hf_model: Any,
          optimizer: Any, processor: Any, n: int, temperature: float, steps: int, out_dir: Path, config: Any = None,
          gap_tolerance: float = GAP_TOLERANCE, on_step: Optional[Callable[[dict], None]] = None,
          drift: Optional[Callable[[Any, Any], Mapping[str, Any]]] = None, start_step: int = 1,
          credit: Any = None) -> list[dict]:
    """Run the loop (module docstring); returns the metrics lines written. `start_step` > 1
    continues a run (its weights and optimizer restored by the caller): steps `start_step` to
    `steps` are run and appended to the files, whose lines of later steps are dropped first.
    `credit` (`training/turn_credit.Credit`): the advantage estimator and per-turn rewards; its
    metrics (`CREDIT_FIELDS`) follow `STEP_FIELDS` in each line. None: GRPO on the episode reward."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 1 <= start_step <= steps:
        raise ValueError(f"start_step must be in 1..{steps}, got {start_step}")
    config = actor_config(n) if config is None else config
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = "w" if start_step == 1 else "a"
    if start_step > 1:
        for name in (METRICS_FILE, GUARD_FILE):
            keep_steps_before(out_dir / name, start_step)
    records: list[dict] = []
    with open(out_dir / METRICS_FILE, mode, encoding="utf-8") as metrics_file, \
            open(out_dir / GUARD_FILE, mode, encoding="utf-8") as guard_file:
        for step in range(start_step, steps + 1):
            started = time.perf_counter()
            batch = rollout(prompts)
            scores = list(reward(batch))
            if len(scores) != len(batch.batch["responses"]):
                raise LearnError(f"step {step}: {len(scores)} rewards for {len(batch.batch['responses'])} rows")
            rolled = time.perf_counter()
            # eval mode, as the engine computes (no dropout): old log-probs = the current model's
            step_drift: dict = {}
            on_log_prob = None if drift is None else (lambda log_prob: step_drift.update(drift(batch, log_prob)))
            turns = None if credit is None else credit.turn_rewards(batch, scores)
            update = grpo_step(hf_model, optimizer, processor, batch, [s["overall"] for s in scores], n, temperature,
                               config, ref_log_prob=reference(batch), on_log_prob=on_log_prob,
                               **({} if credit is None else {"estimator": credit.estimator,
                                                             "turn_rewards": [t.total for t in turns]}))
            updated = time.perf_counter()
            movement = float(probe(hf_model))  # what a sync that did nothing would leave
            sync(hf_model)
            gap = float(probe(hf_model))
            synced = time.perf_counter()
            # an episode counts once, by its last row (a segmented batch has several rows an episode)
            record = step_record(step, [scores[row] for row in last_rows(batch)], update, gap, movement, batch,
                                 (rolled - started, updated - rolled, synced - updated), step_drift)
            if credit is not None:
                record.update(credit.metrics(batch, turns, n))
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            guard_file.write(json.dumps({"step": step, **(batch.meta_info.get("guard") or {}), **step_drift}) + "\n")
            guard_file.flush()
            records.append(record)
            if on_step is not None:
                on_step(record)
            check_record(record, gap_tolerance)
    return records


def steps_before(path: Path, step: int) -> list[dict]:
    """The JSON lines of `path` whose `step` is before `step` (a resumed run's earlier steps)."""
    if not Path(path).exists():
        return []
    lines = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return [line for line in lines if int(line.get("step", 0)) < step]


def keep_steps_before(path: Path, step: int) -> None:
    """Drop the lines of `path` from `step` on (lines a crash left after its checkpoint)."""
    if Path(path).exists():
        Path(path).write_text("".join(json.dumps(line) + "\n" for line in steps_before(path, step)), encoding="utf-8")


__all__ = ["CREDIT_FIELDS", "GAP_TOLERANCE", "GUARD_FILE", "MOVEMENT_FACTOR", "LearnError", "no_signal", "METRICS_FILE", "STEP_FIELDS", "check_record", "episode_scores",
           "episode_texts", "keep_steps_before", "learn", "pages_shown_mean", "steps_before", "reward_summary", "step_record", "turns_mean"]
