"""Multimodal rope (mrope) position ids of the Qwen VL families, pure torch.

The trainer's actor recomputes positions with the model's own ``get_rope_index``; positions the
rollout hands back must match it exactly, including sequences built turn by turn (``start``).
For still images Qwen2-VL, Qwen2.5-VL and Qwen3-VL share this rule (see ``families``); the tests
compare it with each family's own ``get_rope_index``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _pad_runs(ids: torch.Tensor, pad_id: int) -> list[tuple[int, int]]:
    """[(start, end)) of every maximal run of ``pad_id`` in a 1-D tensor."""
    is_pad = (ids == pad_id).to(torch.int8)
    edges = torch.diff(is_pad, prepend=is_pad.new_zeros(1), append=is_pad.new_zeros(1))
    starts = (edges == 1).nonzero().flatten().tolist()
    ends = (edges == -1).nonzero().flatten().tolist()
    return list(zip(starts, ends))


def _image_block(grid: tuple[int, int, int], merge_size: int) -> torch.Tensor:
    """(3, t*h*w/merge^2) offsets (t, h, w) of one image's merged patches, row-major."""
    t, h, w = grid
    gh, gw = h // merge_size, w // merge_size
    ti = torch.arange(t).view(t, 1, 1).expand(t, gh, gw)
    hi = torch.arange(gh).view(1, gh, 1).expand(t, gh, gw)
    wi = torch.arange(gw).view(1, 1, gw).expand(t, gh, gw)
    return torch.stack([ti.flatten(), hi.flatten(), wi.flatten()])


def _check_grid(k: int, grid: Sequence[int], merge_size: int) -> tuple[int, int, int]:
    if len(grid) != 3 or any(int(g) < 1 for g in grid):
        raise ValueError(f"image {k}: grid must be three positive ints (t, h, w), got {tuple(grid)}")
    t, h, w = (int(g) for g in grid)
    if h % merge_size or w % merge_size:
        raise ValueError(f"image {k}: grid {(t, h, w)} h and w must be multiples of merge_size={merge_size}")
    return t, h, w


def rope_positions(
    token_ids: Sequence[int] | torch.Tensor,
    image_grids: Sequence[tuple[int, int, int]],
    *,
    image_pad_id: int,
    merge_size: int = 2,
    start: int = 0,
) -> torch.LongTensor:
    """(3, L) mrope positions (t, h, w rows) of one unpadded sequence.

    Each image is one contiguous run of exactly t*h*w/merge^2 ``image_pad_id`` tokens, in the
    order of ``image_grids`` (images must be separated, e.g. by vision end/start tokens). Text
    positions count up from ``start`` on all three rows; an image's patches sit at the next
    text position plus their (t, h, w) offsets, and text after it resumes at the maximum over
    all three rows + 1, as in Qwen2-VL's ``get_rope_index``.

    (For still images t == 1 and this equals transformers 5's rule, previous position +
    max(h, w) / merge; the two differ only for video-like grids with t > max(h, w) / merge,
    where this follows the original Qwen2-VL / EasyR1 code.)
    """
    if merge_size < 1:
        raise ValueError(f"merge_size must be >= 1, got {merge_size}")
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    if ids.dim() != 1:
        raise ValueError(f"token_ids must be one 1-D sequence, got shape {tuple(ids.shape)}")
    runs = _pad_runs(ids, image_pad_id)
    if len(runs) != len(image_grids):
        raise ValueError(
            f"found {len(runs)} image pad run(s) but {len(image_grids)} image grid(s): every image "
            "needs exactly one contiguous, separated run of image pad tokens"
        )
    out = torch.empty((3, ids.numel()), dtype=torch.long)
    pos, prev = int(start), 0
    for k, ((s, e), grid) in enumerate(zip(runs, image_grids)):
        t, h, w = _check_grid(k, grid, merge_size)
        need = t * h * w // (merge_size * merge_size)
        if e - s != need:
            raise ValueError(
                f"image {k}: pad run at [{s}, {e}) has {e - s} tokens but grid {(t, h, w)} "
                f"needs t*h*w/merge^2 = {need}"
            )
        out[:, prev:s] = torch.arange(pos, pos + s - prev)
        pos += s - prev
        block = _image_block((t, h, w), merge_size) + pos
        out[:, s:e] = block
        pos = int(block.max()) + 1
        prev = e
    out[:, prev:] = torch.arange(pos, pos + ids.numel() - prev)
    return out


def text_positions(attention_mask: torch.Tensor) -> torch.LongTensor:
    """EasyR1's text position row: clip(cumsum(mask) - 1, min=0) along the last dim.

    Left padding gets 0, the first real token 0, then 1, 2, ... (pads inside a sample repeat).
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
