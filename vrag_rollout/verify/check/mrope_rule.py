"""The mrope rule of still images, vectorised: expected (t, h, w) positions of one row from its
token ids, attention mask and image grids alone, cheap enough for every sample of every batch.

Contract: `rule_positions(ids, attention, grids, image_pad, merge)` gives the (3, L) positions
the Qwen VL families' `get_rope_index` gives a row whose images are still images (grid t == 1):
over attended tokens, a text token takes the next position on all three rows; an image's pad run
of h*w/merge^2 tokens sits at the next position plus each merged patch's (0, row, column); text
after it resumes at that start + max(h, w)/merge. Unattended positions hold 1 (as
`get_rope_index` leaves them). None when the rule does not apply (a video-like grid, or pad runs
that do not match the grids: the image checks report those) and the caller falls back to the
model's own `get_rope_index`. The guard compares every sample with this rule and a drawn share
with `get_rope_index` itself; tests/verify/test_mrope_rule.py holds the two equal on random
layouts of every family.
"""

from __future__ import annotations

from typing import Optional

import torch


def rule_positions(ids: torch.Tensor, attention: torch.Tensor, grids: Optional[torch.Tensor], image_pad: int,
                   merge: int) -> Optional[torch.Tensor]:
    valid = attention.bool()
    seq = torch.masked_select(ids, valid)  # masked_select, not boolean indexing: many times faster on CPU
    is_pad = seq == image_pad
    edges = torch.diff(is_pad.to(torch.int8), prepend=is_pad.new_zeros(1, dtype=torch.int8),
                       append=is_pad.new_zeros(1, dtype=torch.int8))
    starts, ends = (edges == 1).nonzero().flatten(), (edges == -1).nonzero().flatten()
    grid_rows = [] if grids is None else [tuple(int(v) for v in grid) for grid in grids]
    if len(starts) != len(grid_rows):
        return None
    step = torch.ones(seq.numel(), dtype=torch.long)  # how far each token moves the next position
    step[is_pad] = 0
    offsets = torch.zeros((3, seq.numel()), dtype=torch.long)
    for start, end, (t, h, w) in zip(starts.tolist(), ends.tolist(), grid_rows):
        rows, cols = h // merge, w // merge
        if t != 1 or end - start != rows * cols:
            return None
        step[end - 1] = max(rows, cols)
        offsets[1, start:end] = torch.arange(rows).repeat_interleave(cols)
        offsets[2, start:end] = torch.arange(cols).repeat(rows)
    base = torch.cumsum(step, 0) - step  # each token's start: the steps of the tokens before it
    out = torch.ones((3, ids.numel()), dtype=torch.long)
    return out.masked_scatter_(valid.expand(3, -1), base + offsets)
