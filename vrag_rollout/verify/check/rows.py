"""One sample's views of a batch whose shapes passed, for the per-sample checks.

Contract: `sample_rows(saved)` gives one `Row` per sample: the full prompt+response row
(`ids`, `attention`, `positions`) and its response part (`responses`, `real` = attention_mask's
response part, `response_mask`, `loss` = `loss_mask`, else `response_mask`), plus the sample's
`termination_reason`; `sampled` = `sampled_mask` (a segmented batch's: every token the policy
sampled, the row's context included), else `loss`, and `context` = the row's `context_length`
(0 without one). Call it only after `contract.check_shapes` found no failure.
`first_bad(flags)` is the index of the first true flag, or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..saved_batch import SavedBatch


@dataclass
class Row:
    """One sample's views: full row (prompt + response) and response part."""

    index: int
    prompt_len: int
    ids: torch.Tensor  # (P+R,)
    attention: torch.Tensor  # (P+R,)
    responses: torch.Tensor  # (R,)
    real: torch.Tensor  # (R,) attention_mask's response part
    response_mask: torch.Tensor
    loss: torch.Tensor
    positions: torch.Tensor  # (rows, P+R) or (P+R,)
    reason: Any
    sampled: Optional[torch.Tensor] = None  # (R,) every token the policy sampled (None: `loss`)
    context: int = 0  # response tokens before the row's own turns (a segment row's context)

    def __post_init__(self) -> None:
        if self.sampled is None:  # one row per episode: what the policy sampled is what it trains on
            self.sampled = self.loss


def sample_rows(saved: SavedBatch) -> list[Row]:
    t = saved.tensors
    P = int(t["prompts"].shape[1])
    loss = t["loss_mask"] if "loss_mask" in t else t["response_mask"]
    reasons = saved.column("termination_reason")
    sampled = t["sampled_mask"] if "sampled_mask" in t else loss
    contexts = saved.columns.get("context_length")
    return [
        Row(
            index=row, prompt_len=P, ids=t["input_ids"][row].long(), attention=t["attention_mask"][row],
            responses=t["responses"][row].long(), real=t["attention_mask"][row, P:],
            response_mask=t["response_mask"][row],
            loss=loss[row], positions=t["position_ids"][row].long(), reason=reasons[row],
            sampled=sampled[row], context=0 if contexts is None else int(contexts[row]),
        )
        for row in range(len(saved))
    ]


def first_bad(flags: torch.Tensor) -> Optional[int]:
    idx = flags.nonzero()
    return int(idx[0]) if len(idx) else None
