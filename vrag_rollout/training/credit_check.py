"""An independent check of turn-level credit on a batch: the right reward to the right turn, and
advantages only where the policy sampled. Pure.

`check_credit(batch, truths, scores, turn_rewards, advantages, estimator, n, weights)` returns a
list of problems (empty: the credit is right). It recomputes what it checks by other routes than
`core.turn_rewards` and `training/estimators.token_advantages`:

- each turn's retrieval share as a difference of today's episode reward
  (`core.reward.retrieval_score` of the pages shown up to turn t, minus up to turn t - 1), the
  outcome as the episode's `overall` (less its retrieval part when that moved to the turns) on the
  last turn, the shaping parts by counting pages again; a turn whose reward differs (e.g. a turn's
  reward given to the next turn) is named;
- every token the policy did not sample (`loss_mask` 0: observations, padding) must have an
  advantage of exactly 0 (e.g. an advantage planted on an observation token is named);
- each sampled token's advantage must equal its turn's value, read token by token in a plain loop
  over `turn_ids`, of `estimators.turn_values` on the recomputed rewards (a tensor shifted by a turn,
  or values from shifted rewards, differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.reward import (
    GroundTruth,
    RewardWeights,
    parse_ground_truth,
    retrieval_score,
    split_page_id,
)
from ..core.turn_rewards import TurnRewardWeights, preset
from .estimators import page_states, turn_values

TOLERANCE = 1e-5


def _prefix_retrieval(truth: GroundTruth, turn_page_ids: Sequence[Sequence[str]], upto: int) -> float:
    shown = tuple(tuple(str(p) for p in pages) for pages in turn_page_ids[:upto])
    return retrieval_score(GroundTruth(truth.answer, truth.doc_id, truth.gold_pages, shown))


def expected_turn_rewards(turn_page_ids: Sequence[Sequence[str]], score: dict, ground_truth: Any,
                          weights: TurnRewardWeights, reward_weights: RewardWeights = RewardWeights()) -> list:
    """Each turn's reward by the oracle's routes (module docstring); query and invalid parts are
    not recomputed (they need the turns' text), so this oracle expects them off."""
    truth = parse_ground_truth(ground_truth)
    turns = len(turn_page_ids)
    if turns == 0:
        return []
    out = [0.0] * turns
    out[-1] = float(score["overall"])
    if weights.retrieval_by_turn:
        out[-1] -= reward_weights.retrieval * float(score["retrieval"])
        for t in range(turns):
            out[t] += reward_weights.retrieval * (_prefix_retrieval(truth, turn_page_ids, t + 1)
                                                  - _prefix_retrieval(truth, turn_page_ids, t))
    seen: set = set()
    for t, pages in enumerate(turn_page_ids):
        for page in pages:
            doc, number = split_page_id(str(page))
            if (doc, number) in seen:
                out[t] -= weights.repeat_page
            elif weights.new_gold and _is_gold(truth, doc, number, seen):
                out[t] += weights.new_gold
            seen.add((doc, number))
    return out


def _is_gold(truth: GroundTruth, doc: str, number: int, seen: set) -> bool:
    numbers = {p for p in truth.gold_pages if not isinstance(p, tuple)}
    if truth.doc_id is None and numbers:
        return number in numbers and all(n != number for _, n in seen)
    return (doc, number) in {p if isinstance(p, tuple) else (truth.doc_id, p) for p in truth.gold_pages}


def check_credit(batch: Any, truths: Sequence[Any], scores: Sequence[dict], turn_rewards: Sequence[Sequence[float]],
                 advantages: torch.Tensor, estimator: str, n: int, weights: Any = "off",
                 mask_key: str = "loss_mask") -> list[str]:
    weights = preset(weights)
    problems: list = []
    pages = [[list(t) for t in row] for row in batch.non_tensor_batch["turn_page_ids"]]
    expected = [expected_turn_rewards(pages[row], scores[row], truths[row // n], weights) for row in range(len(pages))]
    for row, (got, want) in enumerate(zip(turn_rewards, expected)):
        if len(got) != len(want):
            problems.append(f"row {row}: {len(got)} turn rewards for {len(want)} turns")
            continue
        for turn, (a, b) in enumerate(zip(got, want)):
            if abs(a - b) > TOLERANCE:
                problems.append(f"row {row} turn {turn + 1}: reward {a:.6f}, expected {b:.6f}")
    mask = batch.batch[mask_key].bool()
    turn_ids = batch.batch["turn_ids"]
    outside = (advantages != 0) & ~mask
    for row, col in outside.nonzero().tolist():
        problems.append(f"row {row} token {col} (turn {int(turn_ids[row, col])}, not sampled by the policy): "
                        f"advantage {float(advantages[row, col]):.6f}, expected 0")
    states = [page_states(row) for row in pages] if estimator == "gigpo" else None
    index = [row // n for row in range(len(pages))]
    if estimator == "grpo":
        return problems  # verl's own GRPO: the turn layout is checked above, the values by tests against verl
    values = turn_values(estimator, expected, index, states)
    for row in range(len(pages)):
        for col in range(advantages.shape[1]):
            if not mask[row, col]:
                continue
            turn = int(turn_ids[row, col])
            want = values[row][turn - 1] if 1 <= turn <= len(values[row]) else float("nan")
            if not abs(float(advantages[row, col]) - want) <= TOLERANCE:
                problems.append(f"row {row} token {col} (turn {turn}): advantage {float(advantages[row, col]):.6f}, "
                                f"expected {want:.6f}")
    return problems


__all__ = ["check_credit", "expected_turn_rewards"]
