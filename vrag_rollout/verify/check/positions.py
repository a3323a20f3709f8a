"""Position checks ("positions"): a sample's `position_ids` against the model's own rope index.

Contract: `check_positions(row, grids, oracle)` checks that the mrope rows equal the family's
own transformers `get_rope_index` on the full sequence with the processor's grids (from
`images.check_images`), at every attended position; and that the text row (row 0 of the
(B, 4, L) layout, or a (B, L) layout) counts 0, 1, 2, … over attended tokens and never returns
to 0 inside a sample (flash-attention's varlen split would cut the sample there). The caller
skips a sample with images whose image tokens are broken (no grids to compare with).
"""

from __future__ import annotations

from typing import Optional

import torch

from .oracle import ModelOracle
from .report import Failure
from .rows import Row, first_bad


def check_positions(row: Row, grids: Optional[torch.Tensor], oracle: ModelOracle,
                    expected: Optional[torch.Tensor] = None, source: str = "get_rope_index") -> list[Failure]:
    """`expected`: the (3, L) mrope positions to compare with (`mrope_rule.rule_positions`, named by
    `source`); by default the family's own `get_rope_index`."""
    s, pos, valid = row.index, row.positions, row.attention.bool()
    fails: list[Failure] = []
    n_valid = int(valid.sum())
    count = torch.arange(n_valid, dtype=pos.dtype)
    text = pos if pos.dim() == 1 else (pos[0] if pos.shape[0] == 4 else None)
    if text is not None:
        # masked_select and argmax, not boolean indexing and nonzero: many times faster on CPU
        bad = first_bad(torch.masked_select(text, valid) != count)
        if bad is not None:
            where = int(valid.nonzero().flatten()[bad])
            fails.append(Failure("positions", s, where,
                                 f"text position {int(text[where])}, expected {bad} (attended tokens before it)"))
        first = int(valid.to(torch.int8).argmax()) if n_valid else 0
        zero = first_bad(text[first + 1:] == 0)
        if zero is not None:
            fails.append(Failure("positions", s, first + 1 + zero, "text position returns to 0 inside the sample"))
    if pos.dim() == 2:
        if expected is None:
            expected = oracle.rope_index(row.ids, row.attention, grids)
        rope = pos[1:] if pos.shape[0] == 4 else pos
        diff = (rope != expected).any(dim=0) & valid
        bad = first_bad(diff)
        if bad is not None:
            region = "prompt" if bad < row.prompt_len else f"response position {bad - row.prompt_len}"
            fails.append(Failure("positions", s, bad,
                                 f"mrope (t, h, w) = {tuple(rope[:, bad].tolist())}, {source} gives "
                                 f"{tuple(expected[:, bad].tolist())} ({region}; {int(diff.sum())} positions differ)"))
    return fails
