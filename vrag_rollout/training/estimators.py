"""Turn-level advantage estimators over per-turn rewards. Pure (lists and tensors in, out).

Inputs, per row (one episode): `rewards[i]`, its turns' rewards (`core.turn_rewards`; turn t's
reward is what turn t's action earned, the outcome on the last turn), `index[i]`, its episode
group (the prompt: verl's / EasyR1's `uid`), and for `gigpo` `states[i][t]`, a hashable key of the
retrieval state turn t acted from (`page_states`: the set of pages shown before it).

`turn_values(name, rewards, index, states=None)` -> per row, per turn, the advantage:

- `grpo`: every turn gets the episode's group-normalised return, (R_i - mean_g R) / (std_g R + 1e-6)
  with R_i = sum of the row's turn rewards (verl's `compute_grpo_outcome_advantage`, unbiased std).
  `training/grpo.py` keeps calling verl itself for `grpo`: advantages are bit-identical to today's.
- `turn`: reward-to-go with a leave-one-out baseline: A_t^i = G_t^i - b_t^i, G_t^i = sum_{k>=t} r_k^i,
  b_t^i = mean over the group's other rows j of G_{min(t, T_j)}^j (the others' reward-to-go from the
  same turn, or from their last turn when they stopped earlier). b_t^i is a function of the other
  rows only, which are sampled independently of row i, so it does not depend on row i's actions:
  E[grad log pi(a_t|s_t) b_t] = 0, the estimate is unbiased whatever the policy's stopping turn.
  (A per-turn-index normalisation whose baseline sums the turn means up to the row's *own* last
  turn is not: the number of terms is the row's own choice; tests/training/ shows the difference.)
  No std division (a scale that depends on the row's own return would bias it; Adam rescales).
- `gigpo`: GiGPO's two levels, mean-normalised: A_t^i = (R_i - mean_g R) + w * (G_t^i - mean_{S} G_t),
  S = the turns of the same episode group acting from the same state key (any turn index),
  row i's own turn included (a singleton step group gives 0). Row i's state before turn t does not
  depend on its action at t, so neither does the step baseline.

`token_advantages(values, turn_ids, mask)` puts each turn's value on its sampled tokens
(`mask` 1 and `turn_ids` == t, 1-based turns as the rollout numbers them); every other token
(observation, padding) gets exactly 0. `turns_from_mask(mask)` numbers turns where no `turn_ids`
reach the estimator (verl's registry): each run of sampled tokens starts a turn, the masked tokens
after it (its observation) belong to it. `turn_rewards_from_tokens(token_rewards, turn_ids)` sums a
(B, R) reward tensor per turn (a turn's reward placed on any of its tokens counts for it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

import torch

ESTIMATORS = ("grpo", "turn", "gigpo")
EPSILON = 1e-6


def _groups(index: Sequence[Any]) -> dict:
    groups: dict = defaultdict(list)
    for row, key in enumerate(index):
        groups[key].append(row)
    return groups


def reward_to_go(rewards: Sequence[float], gamma: float = 1.0) -> list:
    out, running = [0.0] * len(rewards), 0.0
    for turn in reversed(range(len(rewards))):
        running = float(rewards[turn]) + gamma * running
        out[turn] = running
    return out


def grpo_values(rewards: Sequence[Sequence[float]], index: Sequence[Any]) -> list:
    returns = [float(sum(row)) for row in rewards]
    out: list = [None] * len(rewards)
    for rows in _groups(index).values():
        scores = [returns[r] for r in rows]
        mean, std = 0.0, 1.0  # verl's one-row group
        if len(rows) > 1:
            mean = sum(scores) / len(scores)
            std = (sum((x - mean) ** 2 for x in scores) / (len(scores) - 1)) ** 0.5  # unbiased, as torch.std
        for r, score in zip(rows, scores):
            out[r] = [(score - mean) / (std + EPSILON)] * len(rewards[r])
    return out


def turn_rtg_values(rewards: Sequence[Sequence[float]], index: Sequence[Any], gamma: float = 1.0) -> list:
    togo = [reward_to_go(row, gamma) for row in rewards]
    out: list = [None] * len(rewards)
    for rows in _groups(index).values():
        for r in rows:
            others = [o for o in rows if o != r and togo[o]]
            values = []
            for t, own in enumerate(togo[r]):
                base = sum(togo[o][min(t, len(togo[o]) - 1)] for o in others) / len(others) if others else 0.0
                values.append(own - base)
            out[r] = values
    return out


def gigpo_values(rewards: Sequence[Sequence[float]], index: Sequence[Any], states: Sequence[Sequence[Hashable]],
                 step_weight: float = 1.0, gamma: float = 1.0) -> list:
    togo = [reward_to_go(row, gamma) for row in rewards]
    returns = [float(sum(row)) for row in rewards]
    out: list = [None] * len(rewards)
    for group, rows in _groups(index).items():
        episode_mean = sum(returns[r] for r in rows) / len(rows)
        steps: dict = defaultdict(list)
        for r in rows:
            if len(states[r]) != len(rewards[r]):
                raise ValueError(f"row {r}: {len(states[r])} state keys for {len(rewards[r])} turns")
            for t, key in enumerate(states[r]):
                steps[key].append(togo[r][t])
        for r in rows:
            out[r] = [returns[r] - episode_mean + step_weight * (togo[r][t] - sum(steps[key]) / len(steps[key]))
                      for t, key in enumerate(states[r])]
    return out


def turn_values(name: str, rewards: Sequence[Sequence[float]], index: Sequence[Any],
                states: Sequence[Sequence[Hashable]] | None = None, gamma: float = 1.0,
                step_weight: float = 1.0) -> list:
    """Per row, per turn, the advantage of estimator `name` (module docstring)."""
    if len(rewards) != len(index):
        raise ValueError(f"{len(rewards)} rows of turn rewards for {len(index)} group ids")
    if name == "grpo":
        return grpo_values(rewards, index)
    if name == "turn":
        return turn_rtg_values(rewards, index, gamma)
    if name == "gigpo":
        if states is None:
            raise ValueError("gigpo needs each turn's state key (page_states of the batch's turn_page_ids)")
        return gigpo_values(rewards, index, states, step_weight, gamma)
    raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {name!r}")


def page_states(turn_page_ids: Sequence[Sequence[str]]) -> list:
    """Per turn, the retrieval state it acted from: the set of page ids shown before it."""
    seen: set = set()
    out = []
    for pages in turn_page_ids:
        out.append(frozenset(seen))
        seen.update(str(page) for page in pages)
    return out


def token_advantages(values: Sequence[Sequence[float]], turn_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) float32: turn t's value on row i's sampled tokens of turn t, 0 on every other token."""
    out = torch.zeros(turn_ids.shape, dtype=torch.float32)
    sampled = mask.bool()
    for row, row_values in enumerate(values):
        ids = turn_ids[row]
        used = int(ids[sampled[row]].max()) if sampled[row].any() else 0
        if used > len(row_values):
            raise ValueError(f"row {row}: sampled tokens of turn {used}, values for {len(row_values)} turns")
        table = torch.tensor([0.0, *row_values], dtype=torch.float32)
        out[row] = torch.where(sampled[row], table[ids.clamp(0, len(row_values))], torch.zeros(()))
    return out


def turns_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, R) long: the turn (from 1) of each token, counting runs of sampled tokens; 0 before the first."""
    sampled = mask.bool().long()
    starts = sampled - torch.nn.functional.pad(sampled, (1, 0))[:, :-1]
    return (starts == 1).long().cumsum(-1)


def turn_rewards_from_tokens(token_rewards: torch.Tensor, turn_ids: torch.Tensor) -> list:
    """Per row, per turn 1..max, the sum of the rewards on that turn's tokens."""
    out = []
    for row in range(len(turn_ids)):
        turns = int(turn_ids[row].max()) if turn_ids[row].numel() else 0
        sums = torch.zeros(turns + 1, dtype=torch.float64).index_add_(0, turn_ids[row].long(), token_rewards[row].double())
        if turns and float(sums[0]) != 0.0:
            raise ValueError(f"row {row}: a reward on a token before its first turn")
        out.append([float(x) for x in sums[1:]])
    return out


def turn_metrics(rewards: Sequence[Sequence[float]], values: Sequence[Sequence[float]],
                 parts: Sequence[dict] | None = None, max_turns: int = 8) -> dict:
    """`reward/turn/K/mean`, `advantage/turn/K/mean|std` (K from 1) and, given each row's parts,
    `reward/turn/<part>/mean` (per episode, summed over its turns): the logged credit metrics."""
    metrics: dict = {}
    for turn in range(max_turns):
        got = [row[turn] for row in rewards if len(row) > turn]
        adv = [row[turn] for row in values if len(row) > turn]
        if not got:
            break
        metrics[f"reward/turn/{turn + 1}/mean"] = float(sum(got) / len(got))
        tensor = torch.tensor(adv, dtype=torch.float64)
        metrics[f"advantage/turn/{turn + 1}/mean"] = float(tensor.mean())
        metrics[f"advantage/turn/{turn + 1}/std"] = float(tensor.std()) if len(adv) > 1 else 0.0
    for name in (parts[0] if parts else {}):
        metrics[f"reward/turn/{name}/mean"] = float(sum(sum(p[name]) for p in parts) / len(parts))
    return metrics


__all__ = ["ESTIMATORS", "gigpo_values", "grpo_values", "page_states", "reward_to_go", "token_advantages",
           "turn_metrics", "turn_rewards_from_tokens", "turn_rtg_values", "turn_values", "turns_from_mask"]
