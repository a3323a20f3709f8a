"""Turn ids ("turns"), when the batch has them (`turn_ids`, (B, R)).

Oracle, from the loss mask alone: inside a sample's response every token's turn is 1 plus the
number of places before it where a sampled token follows an observation token (each policy turn
begins with a sampled token right after the observation that answered the previous turn); the
observation answering a turn carries that turn's number; padding is 0.
"""

from __future__ import annotations

from typing import Optional

import torch

from .report import Failure
from .rows import Row, first_bad


def expected_turn_ids(loss: torch.Tensor, used: int) -> torch.Tensor:
    """(R,) expected turn ids of a response whose first `used` tokens are real."""
    expected = torch.zeros_like(loss, dtype=torch.long)
    if used:
        flags = loss[:used].long()
        starts = torch.zeros(used, dtype=torch.long)
        starts[1:] = (flags[1:] == 1) & (flags[:-1] == 0)
        expected[:used] = 1 + torch.cumsum(starts, 0)
    return expected


def check_turns(row: Row, turn_ids: Optional[torch.Tensor]) -> list[Failure]:
    if turn_ids is None:
        return []
    used = int(row.real.sum())
    expected = expected_turn_ids(row.sampled, used)
    bad = first_bad(turn_ids.long() != expected)
    if bad is None:
        return []
    where = "padding" if bad >= used else ("a sampled token" if int(row.sampled[bad]) else "an observation token")
    return [Failure("turns", row.index, row.prompt_len + bad,
                    f"turn id {int(turn_ids[bad])} on {where}, expected {int(expected[bad])} (turns begin where a "
                    "sampled token follows an observation; 0 on padding)")]
