"""Per-turn logprob drift: the trainer's log-probs of a batch against the rollout's, turn by turn.

Contract: `turn_drift(actor, rollout, turn_ids, mask)` takes (B, R) tensors (the actor's
log-probs of the response tokens, the engine's per-token log-probs, the batch's `turn_ids` and
the tokens to compare: the loss mask) and returns a `TurnDrift`: per turn index, the mean and the
largest absolute gap over that turn's compared tokens, their count, and the sample-turns with
the largest mean gap. Pure torch on the CPU; nothing is changed.

Why per turn: an engine/trainer mismatch that is numerical (bf16 kernels) spreads evenly over
turns; a structural one (an image's tokens or positions misplaced after some turn) leaves the
turns before it clean and the turns after it far off. `TurnDrift.metrics()` names the turns as
the trainer's logger shows them (`guard/drift/turn_K/mean`, `.../max`).

What is compared is only meaningful where the rollout's log-probs are the sampled distribution's
(`calculate_log_probs`) and no action grammar constrained that distribution: under a grammar the
engine's log-probs are renormalised over the allowed tokens (forced tokens are exactly 0), so
`batch_drift` compares nothing for such a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class TurnDrift:
    mean: dict[int, float] = field(default_factory=dict)  # turn -> mean |actor - rollout| over its tokens
    max: dict[int, float] = field(default_factory=dict)  # turn -> largest gap
    tokens: dict[int, int] = field(default_factory=dict)  # turn -> tokens compared
    worst: list[tuple[int, int, float]] = field(default_factory=list)  # (sample, turn, its mean gap), worst first

    @property
    def turns(self) -> list[int]:
        return sorted(self.mean)

    def metrics(self, prefix: str = "guard/drift/") -> dict[str, float]:
        out: dict[str, float] = {}
        for turn in self.turns:
            out[f"{prefix}turn_{turn}/mean"] = self.mean[turn]
            out[f"{prefix}turn_{turn}/max"] = self.max[turn]
        if self.turns:
            out[f"{prefix}max"] = max(self.max.values())
            out[f"{prefix}worst_turn"] = float(max(self.turns, key=lambda turn: self.mean[turn]))
        return out

    def lines(self) -> list[str]:
        table = [f"turn {t}: mean {self.mean[t]:.2e}, max {self.max[t]:.2e} over {self.tokens[t]} tokens"
                 for t in self.turns]
        return table + [f"sample {s} turn {t}: mean gap {gap:.2e}" for s, t, gap in self.worst]


def turn_drift(actor: torch.Tensor, rollout: torch.Tensor, turn_ids: torch.Tensor, mask: torch.Tensor,
               worst: int = 3) -> TurnDrift:
    """See the module docstring. Tokens outside `mask`, or with turn id 0 (padding), are not compared."""
    if not (actor.shape == rollout.shape == turn_ids.shape == mask.shape) or actor.dim() != 2:
        raise ValueError(f"turn_drift needs four (B, R) tensors of one shape, got {tuple(actor.shape)}, "
                         f"{tuple(rollout.shape)}, {tuple(turn_ids.shape)}, {tuple(mask.shape)}")
    turns = turn_ids.detach().cpu().long()
    keep = mask.detach().cpu().bool() & (turns > 0)
    if not keep.any():
        return TurnDrift()
    gap = (actor.detach().cpu().double() - rollout.detach().cpu().double()).abs()[keep]
    turn = turns[keep]
    sample = keep.nonzero()[:, 0]
    width = int(turn.max()) + 1
    count = torch.bincount(turn, minlength=width)
    total = torch.bincount(turn, weights=gap, minlength=width)
    largest = torch.zeros(width, dtype=gap.dtype).scatter_reduce(0, turn, gap, reduce="amax", include_self=False)
    present = count.nonzero().flatten().tolist()
    # per (sample, turn): its mean gap, for the worst list
    pair = sample * width + turn
    pair_count = torch.bincount(pair, minlength=int(pair.max()) + 1)
    pair_mean = torch.bincount(pair, weights=gap, minlength=len(pair_count)) / pair_count.clamp(min=1)
    seen = pair_count.nonzero().flatten()
    order = seen[torch.argsort(pair_mean[seen], descending=True)][:worst].tolist()
    return TurnDrift(
        mean={t: float(total[t] / count[t]) for t in present},
        max={t: float(largest[t]) for t in present},
        tokens={t: int(count[t]) for t in present},
        worst=[(p // width, p % width, float(pair_mean[p])) for p in order],
    )


def batch_drift(batch: Any, actor: torch.Tensor, mask_key: str = "loss_mask", worst: int = 3) -> Optional[TurnDrift]:
    """`turn_drift` of a trainer batch (DataProto-like) against the actor's (B, R) log-probs of it,
    over `mask_key`'s tokens. None when there is nothing meaningful to compare: the batch lacks
    `rollout_log_probs` or `turn_ids` (the rollout ran without `calculate_log_probs`), or an action
    grammar constrained the sampling (the batch's record of it, `_sampled_under_grammar`: the
    engine's log-probs are then the constrained distribution's, nats from the model's)."""
    tensors = batch.batch
    if "rollout_log_probs" not in tensors.keys() or "turn_ids" not in tensors.keys():
        return None
    if _sampled_under_grammar(batch):
        return None
    return turn_drift(actor, tensors["rollout_log_probs"], tensors["turn_ids"], tensors[mask_key].bool(), worst)


def old_log_prob_drift(batch: Any, print_worst: bool = True) -> dict[str, float]:
    """The step's `guard/drift/...` metrics of a trainer batch after its actor's log-probs
    (`old_log_probs`, over `response_mask`: EasyR1's and verl's names) against the rollout's; {}
    when there is nothing to compare. Prints the worst sample-turns (with their `uid`), one line."""
    if "old_log_probs" not in batch.batch.keys():
        return {}
    drift = batch_drift(batch, batch.batch["old_log_probs"], "response_mask")
    if drift is None or not drift.turns:
        return {}
    if print_worst and drift.worst:
        uids = (getattr(batch, "non_tensor_batch", None) or {}).get("uid")
        worst = ", ".join(f"sample {s}{f' (uid {uids[s]})' if uids is not None else ''} turn {t}: {gap:.2e}"
                          for s, t, gap in drift.worst)
        print(f"guard drift: max {max(drift.max.values()):.2e}; worst sample-turns {worst}", flush=True)
    return drift.metrics()


def _sampled_under_grammar(batch: Any) -> bool:
    """The rollout's record: `meta_info["action_grammar"]` (EasyR1, learn) or, where the trainer
    keeps no batch meta (verl's agent loop), any row's `rollout_meta` column entry."""
    if (getattr(batch, "meta_info", None) or {}).get("action_grammar"):
        return True
    recorded = (getattr(batch, "non_tensor_batch", None) or {}).get("rollout_meta")
    return recorded is not None and any(isinstance(row, dict) and row.get("action_grammar") for row in recorded)


__all__ = ["TurnDrift", "batch_drift", "old_log_prob_drift", "turn_drift"]
