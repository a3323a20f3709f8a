"""Turn credit on a segmented batch (context edits), per episode (pure).

`episode_credit` runs the turn-level estimator (`turn`, `gigpo`: `turn_credit.credit_advantages`)
over the episodes' final rows only (one row an episode, as it reads a batch without segments), on
every sampled token of every turn (`sampled_mask`: a final row holds each earlier turn's sampled
tokens verbatim, with their turn ids, in its context), with each episode's reward and per-turn
rewards read from its final row. `spread_to_rows` then gives every row, on its own `loss_mask`
tokens, the advantage the same token got on the final row: a row's k-th sampled token of turn t
is the final row's k-th sampled token of turn t (checked: the same token ids, else refused).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from .segments import episode_ids, last_rows, rows_view
from .turn_credit import credit_advantages


def episode_credit(estimator: str, batch: Any, rewards: Sequence[float], n: int, mask_key: str = "loss_mask",
                   turn_rewards: Optional[Sequence[Sequence[float]]] = None) -> torch.Tensor:
    """(B, R) turn credit of a segmented batch, per episode (module docstring): `rewards` and
    `turn_rewards` (per row) are read on each episode's final row."""
    ids = episode_ids(batch)
    if "sampled_mask" not in batch.batch.keys():
        raise ValueError("a segmented batch (episode_id) without sampled_mask: its final rows' context turns "
                         "cannot be told apart from their observations")
    ends = last_rows(batch)
    final = credit_advantages(estimator, rows_view(batch, ends), [rewards[row] for row in ends], n, "sampled_mask",
                              None if turn_rewards is None else [turn_rewards[row] for row in ends],
                              index=[int(ids[row]) // n for row in ends])
    return spread_to_rows(batch, final, ends, mask_key)


def spread_to_rows(batch: Any, final: torch.Tensor, ends: Sequence[int], mask_key: str = "loss_mask") -> torch.Tensor:
    """(B, R): each row's `mask_key` tokens given the advantage `final` (one row per episode, on
    its final row `ends[k]`) has on the same token: a row's k-th sampled token of turn t is its
    final row's k-th sampled token of turn t (the verbatim context; checked by token id)."""
    ids = episode_ids(batch)
    end_of = {int(ids[row]): k for k, row in enumerate(ends)}
    tokens, turns = batch.batch["responses"], batch.batch["turn_ids"]
    sampled, mask = batch.batch["sampled_mask"].bool(), batch.batch[mask_key].bool()
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for row, episode in enumerate(ids):
        k = end_of[int(episode)]
        end = ends[k]
        values = torch.zeros(mask.shape[1], dtype=torch.float32)
        for turn in torch.unique(turns[row][mask[row] & sampled[row]]).tolist():
            here = (sampled[row] & (turns[row] == turn)).nonzero().flatten()
            there = (sampled[end] & (turns[end] == turn)).nonzero().flatten()
            if len(here) != len(there) or not torch.equal(tokens[row][here], tokens[end][there]):
                raise ValueError(f"row {row}: its sampled tokens of turn {turn} are not its episode's final row "
                                 f"{end}'s ({len(here)} against {len(there)} tokens, or other ids): the context "
                                 "does not hold the earlier turns verbatim (vrag-rollout check names the row)")
            values[here] = final[k][there].float()
        out[row] = values * mask[row]
    return out


__all__ = ["episode_credit", "spread_to_rows"]
