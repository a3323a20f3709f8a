"""Segment rows in EasyR1's trainer: a context policy's episodes trained as several rows each.

EasyR1's trainer (`RayPPOTrainer`, b44b311) assumes exactly prompts x n rows while it makes a
batch: it unions the rollout's output with the prompts repeated n times (equal sizes or it
raises), counts rows as prompts, filters groups by uid and cuts the batch to
`rollout_batch_size x n` rows. Its update then splits rows into mini-batches that must divide.
So the trainer keeps its one-row-per-episode view while the batch is made, and sees the segment
rows only after:

1. `collapsing`: while `_make_batch_data` (and `_validate`) run, the worker group's
   `generate_sequences` returns each episode's final row only (prompts x n, in order; it holds
   the answer and the episode's page ids), each marked with a step-unique `vrag_episode`; the
   earlier rows wait in a `SegmentStash`. Every invariant of the batch-making code holds as is.
2. The kept final rows are scored there (one score per episode, before expansion, with the
   step's `reward/*` metrics) unless online filtering already scored them.
3. `SegmentStash.expand`: each kept episode's earlier rows go back in front of its final row,
   with the final row's trainer columns (uid, ground truth, ...) and a score of 0: an episode
   is one reward, held by its last row.
4. `pad_rows`: copies of a real row with every mask 0 (`vrag_pad`) fill the batch to a multiple
   of the trainer's divisors (data-parallel world, mini-batch rows, micro-batch rows); after the
   trainer balances the batch, `pads_last` puts them at the end of each rank's share, so no
   mini-batch is all padding (its token mean would divide by 0).
5. `episode_advantages`: the configured estimator (EasyR1's own GRPO, RLOO or GRPO pass@k) runs
   over episodes, each scored by the sum of its rows' token rewards (the KL penalty of every
   row included, as one row would hold it), grouped by uid; every row gets its episode's
   advantage on its own sampled tokens, pads 0.
6. `final_rows`: the step's data metrics are computed on episodes (final rows), not rows; the
   live guard's `guard/` counts and drift on every real row (each row is checked).

Weighting: EasyR1's default `loss_avg_mode: token` is a token mean per mini-batch, and an
episode's rows hold disjoint sampled tokens (a row's context is out of its mask), so each episode
weighs what it would as one row whatever its number of segments. `seq` (a mean of row means)
would weigh an episode by its row count: refused with a context policy (`segment_problems`), as
are the estimators that are not one outcome score per sequence. More rows than prompts x n make
more mini-batches, so more optimizer steps per training step.

Without a context policy nothing here runs: every wrapper calls EasyR1's own function.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ...core.batch import CONTEXT_EDIT
from .common import mark_patched

EPISODE_KEY = "vrag_episode"  # step-unique episode number (the rollout's `episode_id` is per worker)
PAD_KEY = "vrag_pad"
OUTCOME_ESTIMATORS = ("grpo", "rloo", "grpo_passk")  # one outcome score per sequence, times its mask
MASK_KEYS = ("response_mask", "loss_mask", "sampled_mask", "token_level_scores")
METRIC_PREFIX = "segments/"
MARK = "__vrag_segments__"


# ---------------------------------------------------------------------------- configuration
def edits_context(ppo_config: Any) -> bool:
    rollout = getattr(getattr(ppo_config, "worker", None), "rollout", None)
    return bool(getattr(rollout, "edits_context", False))


def segment_problems(ppo_config: Any) -> list:
    """What a context policy cannot train with in EasyR1 (empty list = fine)."""
    if not edits_context(ppo_config):
        return []
    problems = []
    algorithm = getattr(ppo_config, "algorithm", None)
    estimator = str(getattr(getattr(algorithm, "adv_estimator", None), "value",
                            getattr(algorithm, "adv_estimator", None)))
    if algorithm is not None and estimator not in OUTCOME_ESTIMATORS:
        problems.append(f"algorithm.adv_estimator={estimator} with a context policy (context_keep_turns/"
                        f"context_keep_pages): an episode's rows share one advantage, which only the outcome "
                        f"estimators give ({', '.join(OUTCOME_ESTIMATORS)})")
    actor = getattr(getattr(ppo_config, "worker", None), "actor", None)
    mode = getattr(actor, "loss_avg_mode", "token")
    if mode != "token":
        problems.append(f"worker.actor.loss_avg_mode={mode} with a context policy: a mean of row means weighs an "
                        "episode by its number of segments; use loss_avg_mode=token (each sampled token once)")
    return problems


def row_multiple(ppo_config: Any, world_size: int) -> int:
    """The row count every padded batch is a multiple of: the balance's world size, the update's
    mini-batch rows (`global_batch_size x n`), each data-parallel rank's micro-batches."""
    actor, rollout = ppo_config.worker.actor, ppo_config.worker.rollout
    n = int(getattr(rollout, "n", 1))
    mini_batch = int(actor.global_batch_size) * (n if n > 1 else 1)
    dp = max(1, world_size // int(getattr(actor, "ulysses_size", 1) or 1))
    micro = [int(getattr(actor, name, 1) or 1) for name in ("micro_batch_size_per_device_for_experience",
                                                             "micro_batch_size_per_device_for_update")]
    return math.lcm(world_size, mini_batch, *(dp * m for m in micro))


# ---------------------------------------------------------------------------- rows of episodes
def episode_runs(output: Any) -> list[list[int]]:
    """The rows of each episode in order (closed segments, then the final row), as the rollout
    writes them: adjacent, `segment_index` counting from 0, only the last not a context edit."""
    columns = output.non_tensor_batch
    if "segment_index" not in columns:
        raise ValueError("a context policy is on but the rollout's output has no `segment_index` column: "
                         "the agent did not write segment rows")
    indices, endings = columns["segment_index"], columns["termination_reason"]
    runs: list[list[int]] = []
    for row, index in enumerate(int(i) for i in indices):
        if index == 0:
            runs.append([])
        if not runs or index != len(runs[-1]):
            raise ValueError(f"row {row}: segment {index} does not follow its episode's rows {runs[-1] if runs else []}")
        runs[-1].append(row)
    for run in runs:
        closed = [str(endings[r]) == CONTEXT_EDIT for r in run]
        if closed != [True] * (len(run) - 1) + [False]:
            raise ValueError(f"rows {run}: an episode's earlier rows end in a context edit and only they do")
    return runs


class SegmentStash:
    """The earlier rows of a step's episodes, kept while the trainer works on their final rows."""

    def __init__(self) -> None:
        self.outputs: list = []  # each generation's full output
        self.earlier: dict[int, tuple[int, list[int]]] = {}  # episode key -> (output, rows)
        self.next_key = 0

    def collapse(self, output: Any) -> Any:
        """The output's final rows, each with its `vrag_episode` key; the earlier rows kept."""
        runs = episode_runs(output)
        episode = np.empty(len(output), dtype=np.int64)
        for run in runs:
            episode[run] = self.next_key
            self.earlier[self.next_key] = (len(self.outputs), run[:-1])
            self.next_key += 1
        output.non_tensor_batch[EPISODE_KEY] = episode
        self.outputs.append(output)
        return output[[run[-1] for run in runs]]

    @contextmanager
    def collapsing(self, worker_group: Any) -> Iterator[None]:
        """`worker_group.generate_sequences` returns final rows while the block runs."""
        own = "generate_sequences" in vars(worker_group)
        generate = worker_group.generate_sequences

        def final_rows_only(prompts: Any, *args: Any, **kwargs: Any) -> Any:
            return self.collapse(generate(prompts, *args, **kwargs))

        worker_group.generate_sequences = final_rows_only
        try:
            yield
        finally:
            if own:
                worker_group.generate_sequences = generate
            else:
                del worker_group.generate_sequences

    def expand(self, batch: Any) -> Any:
        """`batch` (final rows) with each episode's earlier rows before its final row."""
        keys = [int(k) for k in batch.non_tensor_batch[EPISODE_KEY]]
        order: list[int] = []  # for each expanded row, the batch row whose trainer columns it takes
        sources: list[tuple[int, int, int]] = []  # (expanded row, output, output row) of earlier rows
        for row, key in enumerate(keys):
            output, rows = self.earlier.get(key, (0, []))
            for earlier in rows:
                sources.append((len(order), output, earlier))
                order.append(row)
            order.append(row)
        if not sources:
            return batch
        expanded = batch[order]
        for output_index, output in enumerate(self.outputs):
            picked = [(at, row) for at, out, row in sources if out == output_index]
            if not picked:
                continue
            at = [a for a, _ in picked]
            rows = [r for _, r in picked]
            for key in output.batch.keys():
                expanded.batch[key][at] = output.batch[key][rows].to(expanded.batch[key].dtype)
            for key, values in output.non_tensor_batch.items():
                if key in expanded.non_tensor_batch:
                    expanded.non_tensor_batch[key][at] = values[rows]
        if "token_level_scores" in expanded.batch.keys():  # the episode's score is its final row's
            expanded.batch["token_level_scores"][[a for a, _, _ in sources]] = 0
        return expanded


# ---------------------------------------------------------------------------- padding
def pad_rows(batch: Any, multiple: int) -> Any:
    """`batch` and copies of its last row with every mask 0, to a multiple of `multiple` rows."""
    count = (-len(batch)) % multiple
    flags = np.zeros(len(batch), dtype=bool)
    batch.non_tensor_batch[PAD_KEY] = flags
    if count == 0:
        return batch
    pads = batch[[len(batch) - 1] * count]
    for key in MASK_KEYS:
        if key in pads.batch.keys():
            pads.batch[key].zero_()
    pads.non_tensor_batch[PAD_KEY] = np.ones(count, dtype=bool)
    if EPISODE_KEY in pads.non_tensor_batch:
        pads.non_tensor_batch[EPISODE_KEY] = np.full(count, -1, dtype=np.int64)
    return type(batch).concat([batch, pads])


def pads_last(batch: Any, world_size: int) -> None:
    """Within each rank's share (the trainer dispatches contiguous chunks), real rows first."""
    flags = batch.non_tensor_batch.get(PAD_KEY)
    if flags is None or not flags.any():
        return
    import torch

    share = len(batch) // world_size
    order = []
    for start in range(0, len(batch), share):
        rows = range(start, start + share)
        order.extend([r for r in rows if not flags[r]] + [r for r in rows if flags[r]])
    batch.reorder(torch.tensor(order))


def final_rows(batch: Any) -> list[int]:
    """The rows that end an episode (not a closed segment, not a pad)."""
    pads = batch.non_tensor_batch.get(PAD_KEY)
    endings = batch.non_tensor_batch.get("termination_reason")
    return [r for r in range(len(batch)) if not (pads is not None and pads[r])
            and not (endings is not None and str(endings[r]) == CONTEXT_EDIT)]


# ---------------------------------------------------------------------------- advantages
def episode_advantages(batch: Any, estimator: Callable, **kwargs: Any) -> Any:
    """(B, R) advantages: `estimator` (an EasyR1 outcome estimator) over episodes, each scored by
    the sum of its rows' token rewards and grouped by uid; every row gets its episode's value on
    its `response_mask`, pads 0."""
    import torch

    keys = np.asarray(batch.non_tensor_batch[EPISODE_KEY], dtype=np.int64)
    rewards = batch.batch["token_level_rewards"].sum(dim=-1)
    episodes = sorted({int(k) for k in keys if k >= 0})
    where = {key: np.flatnonzero(keys == key) for key in episodes}
    scores = torch.stack([rewards[where[key]].sum() for key in episodes])[:, None]
    uids = np.array([batch.non_tensor_batch["uid"][where[key][-1]] for key in episodes], dtype=object)
    per_episode, _ = estimator(token_level_rewards=scores, response_mask=torch.ones_like(scores), index=uids, **kwargs)
    value = dict(zip(episodes, per_episode[:, 0].tolist()))
    per_row = torch.tensor([value.get(int(k), 0.0) for k in keys], dtype=batch.batch["token_level_rewards"].dtype)
    return per_row[:, None] * batch.batch["response_mask"].to(per_row.dtype)


# ---------------------------------------------------------------------------- the trainer patch
def _reward(trainer: Any, batch: Any) -> tuple:
    import ray

    found = trainer.reward_fn.compute_reward.remote(batch)
    return ray.get(found) if isinstance(found, ray.ObjectRef) else found


def make_batch_data(original: Callable, reduce_metrics: Callable) -> Callable:
    def _make_batch_data(self: Any, metrics: dict) -> Any:
        if not edits_context(self.config):
            return original(self, metrics)
        stash = SegmentStash()
        with stash.collapsing(self.actor_rollout_ref_wg):
            batch = original(self, metrics)
        if "token_level_scores" not in batch.batch.keys():  # one score per episode, on its final row
            scores, reward_metrics = _reward(self, batch)
            batch.batch["token_level_scores"] = scores
            metrics.update({f"reward/{k}": v for k, v in reduce_metrics(reward_metrics).items()})
        episodes = len(batch)
        batch = stash.expand(batch)
        rows = len(batch)
        batch = pad_rows(batch, row_multiple(self.config, self.actor_rollout_ref_wg.world_size))
        metrics.update({METRIC_PREFIX + "episodes": episodes, METRIC_PREFIX + "rows": rows,
                        METRIC_PREFIX + "rows_per_episode": rows / max(episodes, 1),
                        METRIC_PREFIX + "pad_rows": len(batch) - rows})
        return batch

    return mark_patched(_make_batch_data, original)


def make_validate(original: Callable) -> Callable:
    def _validate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not edits_context(self.config):
            return original(self, *args, **kwargs)
        with SegmentStash().collapsing(self.actor_rollout_ref_wg):  # scored on final rows only
            return original(self, *args, **kwargs)

    return mark_patched(_validate, original)


def make_balance_batch(original: Callable) -> Callable:
    def _balance_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, batch, *args, **kwargs)
        pads_last(batch, self.actor_rollout_ref_wg.world_size)
        return result

    return mark_patched(_balance_batch, original)


def make_compute_advantage(original: Callable, estimators: dict) -> Callable:
    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        if EPISODE_KEY not in data.non_tensor_batch:
            return original(data, adv_estimator, *args, **kwargs)
        name = str(getattr(adv_estimator, "value", adv_estimator))
        if name not in OUTCOME_ESTIMATORS:
            raise ValueError(f"adv_estimator={name} on segment rows: only {', '.join(OUTCOME_ESTIMATORS)} give "
                             "every row of an episode its episode's advantage")
        extra = {key: value for key, value in kwargs.items() if key in ("gamma", "lam")}
        advantages = episode_advantages(data, estimators[name], **extra)
        data.batch["advantages"], data.batch["returns"] = advantages, advantages
        return data

    return mark_patched(compute_advantage, original)


def real_rows(batch: Any) -> list[int]:
    pads = batch.non_tensor_batch.get(PAD_KEY)
    return [r for r in range(len(batch)) if pads is None or not pads[r]]


def make_data_metrics(original: Callable) -> Callable:
    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict:
        if EPISODE_KEY not in batch.non_tensor_batch:
            return original(batch, *args, **kwargs)
        found = original(batch[final_rows(batch)], *args, **kwargs)  # per episode, as without segments
        if any(key.startswith("guard/") for key in found):  # the guard's counts and drift: every real row
            from .guard import step_metrics

            found = {key: value for key, value in found.items() if not key.startswith("guard/")}
            found.update(step_metrics(batch[real_rows(batch)]))
        return found

    return mark_patched(compute_data_metrics, original)


def patch_ray_trainer(module: Any) -> dict:
    """Install the wrappers in EasyR1's `verl.trainer.ray_trainer` (idempotent; a name the module
    lacks is left alone). Reported under the ray_trainer patch's own key, as the turn estimators."""
    import importlib

    core_algos = importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".core_algos")
    trainer = getattr(module, "RayPPOTrainer", None)
    wrappers = [(trainer, "_make_batch_data", lambda f: make_batch_data(f, module.reduce_metrics)),
                (trainer, "_validate", make_validate), (trainer, "_balance_batch", make_balance_batch),
                (module, "compute_advantage", lambda f: make_compute_advantage(f, core_algos.ADV_ESTIMATOR_MAP)),
                (module, "compute_data_metrics", make_data_metrics)]
    for owner, name, make in wrappers:
        current = vars(owner).get(name) if owner is not None else None
        if current is None or getattr(current, MARK, False):
            continue
        wrapped = make(current)
        setattr(wrapped, MARK, True)
        setattr(owner, name, wrapped)
    return {}


__all__ = ["EPISODE_KEY", "OUTCOME_ESTIMATORS", "PAD_KEY", "SegmentStash", "edits_context", "episode_advantages",
           "episode_runs", "final_rows", "pad_rows", "pads_last", "patch_ray_trainer", "row_multiple",
           "segment_problems"]
