"""Turn-level credit on a rollout batch: its per-turn rewards and its advantages by estimator.

Contract (the batch is the rollout's output: `turn_ids` (B, R) numbering each response token's turn
from 1, observation included; `loss_mask`; non-tensor `turn_page_ids`; n samples of a prompt on
adjacent rows):

- `batch_turn_rewards(batch, tokenizer, truths, scores, weights)`: per row, `core.turn_rewards`'
  `TurnRewards` from its `turn_page_ids`, its episode score (`scores[row]`, `core.reward`'s dict)
  and its prompt's ground truth (`truths[row // n]`); the turns' actions are decoded from each
  turn's sampled tokens only when a part needs them (repeated query, invalid action). A segmented
  batch (context edits, `episode_id`) gets them per episode, from its final row (every turn's
  pages, the episode's score, every turn's sampled text through `sampled_mask`), and every row of
  the episode carries that episode's `TurnRewards`.
- `credit_advantages(estimator, batch, rewards, n, mask_key, turn_rewards)`: (B, R) advantages of
  `turn` or `gigpo`: `training/estimators`' values put on each turn's sampled tokens (`mask_key`),
  0 on every other token (today's scalar on the last turn when `turn_rewards` is None). gigpo's
  state keys are `estimators.page_states` of `turn_page_ids`; `index` (default row // n) groups
  rows. A segmented batch goes through `training/segment_credit.episode_credit` (this, over its
  final rows). `grpo` stays in
  `training/grpo.estimator_advantages` (verl's GRPO of each row's summed turn rewards), which
  dispatches here for the others.
- `Credit`: what `training/learn.py` calls each step: the estimator's name, the batch's turn
  rewards, and the step's metrics (`estimator`, `reward/turn/K/mean`, `advantage/turn/K/mean|std`,
  `reward/turn/<part>/mean`), over episodes (a segmented batch's final rows).

Pure: the tokenizer only decodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.reward import RewardWeights
from ..core.turn_rewards import (
    TurnRewards,
    TurnRewardWeights,
    preset,
    turn_action,
    turn_rewards,
)
from .estimators import (
    ESTIMATORS,
    page_states,
    token_advantages,
    turn_metrics,
    turn_values,
)
from .segments import episode_ids, last_rows, rows_view


def turn_texts(batch: Any, row: int, tokenizer: Any, mask_key: str = "loss_mask") -> list:
    """Row `row`'s sampled text of each turn (1..num turns), decoded."""
    tokens = batch.batch
    ids, turns, mask = tokens["responses"][row], tokens["turn_ids"][row], tokens[mask_key][row].bool()
    count = len(batch.non_tensor_batch["turn_page_ids"][row])
    return [tokenizer.decode(ids[mask & (turns == turn)].tolist(), skip_special_tokens=True)
            for turn in range(1, count + 1)]


def batch_turn_rewards(batch: Any, tokenizer: Any, truths: Sequence[Any], scores: Sequence[dict],
                       weights: Any = "off", reward_weights: RewardWeights = RewardWeights()) -> list[TurnRewards]:
    weights = preset(weights)
    column = batch.non_tensor_batch["turn_page_ids"]
    ids = episode_ids(batch)
    ends = list(range(len(column))) if ids is None else last_rows(batch)  # a segmented batch: its final rows
    if not truths or len(ends) % len(truths):
        raise ValueError(f"{len(ends)} episodes are not a whole number of samples of {len(truths)} prompts")
    n = len(ends) // len(truths)  # samples a prompt; episode k answers prompt k // n
    # a final row's earlier turns are context (out of loss_mask): their text is in sampled_mask
    mask_key = "sampled_mask" if "sampled_mask" in batch.batch.keys() else "loss_mask"
    needs_actions = bool(weights.repeat_query or weights.invalid)
    of_end = {}
    for row in ends:
        pages = [list(turn) for turn in column[row]]
        actions = ([turn_action(text) for text in turn_texts(batch, row, tokenizer, mask_key)]
                   if needs_actions else None)
        truth = truths[(row if ids is None else int(ids[row])) // n]
        of_end[row] = turn_rewards(pages, scores[row], truth, weights, reward_weights, actions)
    if ids is None:
        return [of_end[row] for row in range(len(column))]
    end_of = {int(ids[row]): row for row in ends}
    return [of_end[end_of[int(episode)]] for episode in ids]


def group_ids(batch_size: int, n: int) -> np.ndarray:
    if batch_size % n:
        raise ValueError(f"batch of {batch_size} is not a whole number of groups of n={n}")
    return np.arange(batch_size) // n


def credit_values(estimator: str, batch: Any, turn_rewards: Sequence[Sequence[float]], n: int,
                  index: Sequence[Any] | None = None) -> list:
    """Per row, per turn, the estimator's value; `index` is each row's group (default row // n)."""
    states = None
    if estimator == "gigpo":
        states = [page_states([list(t) for t in pages]) for pages in batch.non_tensor_batch["turn_page_ids"]]
    return turn_values(estimator, turn_rewards, group_ids(len(turn_rewards), n) if index is None else list(index),
                       states)


def credit_advantages(estimator: str, batch: Any, rewards: Sequence[float], n: int, mask_key: str = "loss_mask",
                      turn_rewards: Sequence[Sequence[float]] | None = None, index: Sequence[Any] | None = None) -> Any:
    if estimator not in ESTIMATORS or estimator == "grpo":
        raise ValueError(f"estimator must be turn or gigpo (grpo is training/grpo.estimator_advantages'), "
                         f"got {estimator!r}")
    if turn_rewards is None:  # today's scalar, on each row's last turn
        turn_rewards = [[0.0] * (len(pages) - 1) + [float(r)] if len(pages) else []
                        for pages, r in zip(batch.non_tensor_batch["turn_page_ids"], rewards)]
    values = credit_values(estimator, batch, turn_rewards, n, index)
    return token_advantages(values, batch.batch["turn_ids"], batch.batch[mask_key])


def trainer_credit(estimator: str, token_level_rewards: Any, response_mask: Any, index: Sequence[Any],
                   turn_ids: Any = None, columns: dict | None = None, weights: Any = "off") -> tuple[Any, dict]:
    """(advantages (B, R), metrics) as a trainer's estimator registry needs them (EasyR1, verl).

    Each turn's reward is what `token_level_rewards` holds on its tokens (the trainers put the
    episode's score on the last sampled token: today's reward on the last turn); with `weights`
    on and the batch's `turn_page_ids` and `ground_truth` columns, the turns' rewards are
    `core.turn_rewards` of that score. Turns are `turn_ids` (the rollout's), else each run of
    sampled tokens (`estimators.turns_from_mask`). gigpo's states need `turn_page_ids`."""
    from ..core.reward import GroundTruth, parse_ground_truth, retrieval_score
    from .estimators import turn_rewards_from_tokens, turns_from_mask

    columns = columns or {}
    turn_ids = turns_from_mask(response_mask) if turn_ids is None else turn_ids
    rewards = turn_rewards_from_tokens(token_level_rewards, turn_ids)
    pages = columns.get("turn_page_ids")
    pages = None if pages is None else [[list(t) for t in row] for row in pages]
    weights = preset(weights)
    if not weights.off:
        if pages is None or columns.get("ground_truth") is None:
            raise ValueError("per-turn rewards need the batch's turn_page_ids and ground_truth columns")
        for row, truth in enumerate(columns["ground_truth"]):
            parsed = parse_ground_truth(truth)
            shown = tuple(tuple(t) for t in pages[row])
            score = {"overall": sum(rewards[row]),
                     "retrieval": retrieval_score(GroundTruth(parsed.answer, parsed.doc_id, parsed.gold_pages, shown))}
            rewards[row] = turn_rewards(pages[row], score, truth, weights).total
    states = None
    if estimator == "gigpo":
        if pages is None:
            raise ValueError("gigpo needs the batch's turn_page_ids column (the retrieval state of each turn)")
        states = [page_states(row)[:len(r)] + [frozenset()] * (len(r) - len(row)) for row, r in zip(pages, rewards)]
    values = turn_values(estimator, rewards, list(index), states)
    advantages = token_advantages(values, turn_ids, response_mask)
    return advantages.to(token_level_rewards.dtype), {"estimator": estimator, **turn_metrics(rewards, values)}


@dataclass
class Credit:
    """The learn loop's turn-level credit (module docstring)."""

    estimator: str = "grpo"
    weights: TurnRewardWeights = TurnRewardWeights()
    tokenizer: Any = None
    truths: Sequence[Any] = ()

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")
        self.weights = preset(self.weights)

    def turn_rewards(self, batch: Any, scores: Sequence[dict]) -> list[TurnRewards]:
        return batch_turn_rewards(batch, self.tokenizer, self.truths, scores, self.weights)

    def metrics(self, batch: Any, rewards: Sequence[TurnRewards], n: int) -> dict:
        """Per episode (a segmented batch's final rows: each episode once, with all its turns)."""
        ids = episode_ids(batch)
        ends = list(range(len(rewards))) if ids is None else last_rows(batch)
        view, index = (batch, None) if ids is None else (rows_view(batch, ends), [int(ids[row]) // n for row in ends])
        totals = [rewards[row].total for row in ends]
        values = credit_values(self.estimator, view, totals, n, index)
        return {"estimator": self.estimator, **turn_metrics(totals, values, [rewards[row].parts for row in ends])}


__all__ = ["Credit", "batch_turn_rewards", "credit_advantages", "credit_values", "group_ids", "trainer_credit", "turn_texts"]
