"""Training on segmented episodes: one advantage and one weight per episode, whatever its rows (pure).

A context policy cuts an episode into rows (`core/context_edit.py`): the batch's `episode_id`
column names each row's episode (episode k answers prompt k // n), and an episode's last row
ends the episode and holds its answer. Row-based GRPO would be wrong twice over: an episode of
three rows would enter its group's mean and std three times, and a row-averaged loss would give
it three times the weight. Here:

- `episode_advantages` scores each episode once (its last row's reward), runs verl's own GRPO
  over episodes grouped by prompt, and gives every row of an episode that advantage on its own
  sampled tokens (`loss_mask`: a row's context is never trained on).
- turn credit per episode is `segment_credit.py`'s (it reads the final rows through `rows_view`).
- `episode_weights` is the per-token factor that makes verl's loss aggregation weigh an episode
  as it would weigh it as one row: under "token-mean" and "token-sum" nothing changes (an
  episode's rows hold disjoint sampled tokens, so its tokens enter once each); under the
  "seq-mean-*" modes a row's tokens are scaled by (its tokens / its episode's tokens) for
  "-token-mean", and the whole by rows / episodes (the modes divide by the row count). verl's
  policy losses are positively homogeneous in the advantage (PPO clip, dual clip), so scaling a
  token's advantage by w > 0 scales its loss by w.

Invariant: for a batch without `episode_id` these are the identity (advantages are verl's GRPO as
today, weights 1).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch


def episode_ids(batch: Any) -> Optional[np.ndarray]:
    """Each row's episode, or None for a batch of one row per episode."""
    ids = batch.non_tensor_batch.get("episode_id")
    return None if ids is None else np.asarray(ids, dtype=np.int64)


def last_rows(batch: Any) -> list[int]:
    """The row ending each episode, in episode order (every row without segments)."""
    ids = episode_ids(batch)
    if ids is None:
        return list(range(len(batch.batch["responses"])))
    last: dict[int, int] = {}
    for row, episode in enumerate(ids):
        last[int(episode)] = row
    return [last[episode] for episode in sorted(last)]


def prompt_rows(batch: Any, n: int) -> list[int]:
    """Per row, the index of the prompt it answers."""
    ids = episode_ids(batch)
    rows = len(batch.batch["responses"])
    return [row // n for row in range(rows)] if ids is None else [int(e) // n for e in ids]


def episode_advantages(batch: Any, rewards: Sequence[float], n: int, mask_key: str = "loss_mask") -> torch.Tensor:
    """(B, R) GRPO advantages by verl over episodes (each scored by its last row), every row of an
    episode given its episode's advantage on its `mask_key` tokens."""
    from verl.trainer.ppo import core_algos

    ids = episode_ids(batch)
    mask = batch.batch[mask_key]
    ends = last_rows(batch)
    scores = torch.tensor([[float(rewards[row])] for row in ends], dtype=torch.float32)
    episodes = sorted({int(e) for e in ids})
    per_episode, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=torch.ones_like(scores),
        index=np.array([episode // n for episode in episodes]), norm_adv_by_std_in_grpo=True)
    of_episode = dict(zip(episodes, per_episode[:, 0].tolist()))
    per_row = torch.tensor([of_episode[int(e)] for e in ids], dtype=torch.float32)
    return per_row[:, None] * mask.to(torch.float32)


def rows_view(batch: Any, rows: Sequence[int]) -> Any:
    """`rows` of `batch` as a batch of their own (tensor and non-tensor columns, `meta_info`), read
    as a batch without segments (no `episode_id`)."""
    from types import SimpleNamespace

    index = torch.as_tensor(list(rows), dtype=torch.long)
    tensors = {key: batch.batch[key][index] for key in batch.batch.keys()}
    columns = {key: np.asarray(value)[list(rows)] for key, value in batch.non_tensor_batch.items()
               if key != "episode_id"}
    return SimpleNamespace(batch=tensors, non_tensor_batch=columns, meta_info=dict(batch.meta_info or {}))


SEQUENCE_MODES = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def episode_weights(batch: Any, loss_agg_mode: str, mask_key: str = "loss_mask") -> Optional[torch.Tensor]:
    """(B, 1) per-row factors making `loss_agg_mode` weigh each episode as one row; None when
    nothing needs scaling (no segments, or a token-level mode)."""
    ids = episode_ids(batch)
    if ids is None or loss_agg_mode not in SEQUENCE_MODES:
        return None
    tokens = batch.batch[mask_key].sum(-1).to(torch.float64)
    per_episode: dict[int, float] = {}
    for row, episode in enumerate(ids):
        per_episode[int(episode)] = per_episode.get(int(episode), 0.0) + float(tokens[row])
    # verl divides a "seq-mean" loss by its rows with tokens: make that the episodes with tokens
    rows_per_episode = int((tokens > 0).sum()) / max(sum(1 for count in per_episode.values() if count > 0), 1)
    if loss_agg_mode == "seq-mean-token-mean":
        share = [float(tokens[row]) / per_episode[int(e)] if per_episode[int(e)] else 0.0 for row, e in enumerate(ids)]
    else:  # token sums: an episode's rows together already hold its sum
        share = [1.0] * len(ids)
    return (torch.tensor(share, dtype=torch.float64) * rows_per_episode).to(torch.float32)[:, None]


__all__ = ["SEQUENCE_MODES", "episode_advantages", "episode_ids", "episode_weights", "last_rows", "prompt_rows",
           "rows_view"]
