"""`drop`'s repair of a sample the trainer's forward pass could not take (`guard.LiveGuard`).

A zeroed mask keeps a sample out of the loss, not out of the forward pass, which scatters each
image's features into its pad run and raises for the whole batch when a sample's image tokens and
images disagree. `empty_samples(batch, rows, guard, band)` makes each of `rows` a sample with no
response whose tokens, images and derived columns agree again, in place:
- its response becomes padding (pad tokens, attention 0); its masks, turn ids and rollout
  log-probs 0;
- its images are its prompt's own when the prompt's pad runs match them (one run per image, each
  as long as the image processor makes that image); otherwise (a prompt image of the wrong size,
  a page ahead of the prompt's image) the prompt's vision tokens go too: the prompt keeps its
  text, left-padded again, and the sample has no image;
- what the reward reads of it is emptied (`page_ids`; verl's `tool_extra_fields["page_ids"]`), so
  it scores as the empty response it now is;
- its `position_ids` are recomputed (`rollout_positions`: the rollout's layout, the family's own
  `get_rope_index`), unless the trainer passes its own re-derivation (`LiveGuard(rederive=)`:
  verl's worker recomputes `multi_modal_inputs`, positions and `rm_scores` with verl's code).
Invariant (checked by `LiveGuard` after every repair): the guard finds no image-token or position
failure on a repaired sample.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from .image_entries import entry_image

_ZEROED = ("response_mask", "loss_mask", "turn_ids", "rollout_log_probs")
PAGE_COLUMNS = ("page_ids", "turn_page_ids")  # what a reward or a report reads the shown pages from


def empty_samples(batch: Any, rows: Sequence[int], guard: Any, band: Mapping) -> None:
    if not rows:
        return
    oracle, t = guard.oracle, batch.batch
    width = int(t["prompts"].shape[1])
    pad = oracle.tokenizer.pad_token_id if oracle.tokenizer.pad_token_id is not None else 0
    columns = batch.non_tensor_batch if batch.non_tensor_batch is not None else {}
    media = columns.get("multi_modal_data")
    vision = torch.tensor(sorted(oracle.vision_ids))
    for s in rows:
        item = media[s] if media is not None else None
        key = ("images" if "images" in item else "image") if isinstance(item, Mapping) else "images"
        entries = list((item or {}).get(key) or [])
        attended = t["attention_mask"][s, :width].bool()
        shown = t["prompts"][s][attended]
        starts = int(((shown[1:] == oracle.image_pad) & (shown[:-1] == oracle.vision_start)).sum())
        kept = entries[:starts]
        if not _runs_match(shown, kept, guard, band):
            shown, kept = shown[~torch.isin(shown, vision.to(shown.dtype))], []
            t["prompts"][s] = pad
            t["prompts"][s, width - len(shown):] = shown
            t["attention_mask"][s, :width] = 0
            t["attention_mask"][s, width - len(shown):width] = 1
        t["responses"][s] = pad
        t["attention_mask"][s, width:] = 0
        t["input_ids"][s] = torch.cat([t["prompts"][s], t["responses"][s]])
        for name in _ZEROED:
            if name in t.keys():
                t[name][s] = 0
        if media is not None and item is not None:
            media[s] = {**item, key: kept}
        for name in PAGE_COLUMNS:
            if name in columns:
                columns[name][s] = []
        extra = columns.get("tool_extra_fields")
        if extra is not None and isinstance(extra[s], Mapping) and "page_ids" in extra[s]:
            extra[s] = {**extra[s], "page_ids": []}


def _runs_match(shown: torch.Tensor, images: list, guard: Any, band: Mapping) -> bool:
    """Whether the prompt's pad runs are, in order, exactly `images`' (count and lengths)."""
    runs = _pad_runs(shown, guard.oracle.image_pad)
    if len(runs) != len(images):
        return False
    return all(end - start == guard.image_run_length(entry_image(image), band)
               for (start, end), image in zip(runs, images))


def _pad_runs(ids: torch.Tensor, pad: int) -> list[tuple[int, int]]:
    flags = (ids == pad).to(torch.int8)
    edges = torch.diff(flags, prepend=flags.new_zeros(1), append=flags.new_zeros(1))
    return list(zip((edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()))


def rollout_positions(batch: Any, rows: Sequence[int], guard: Any, band: Mapping) -> None:
    """Recompute `rows`' `position_ids` in the rollout's layout ((B, L) text, (B, 3, L) mrope, or
    (B, 4, L) text + mrope): the text row counts attended tokens as EasyR1 does (cumsum - 1, at
    least 0), the mrope rows are the family's own `get_rope_index` on the images the sample keeps."""
    t = batch.batch
    positions = t.get("position_ids") if hasattr(t, "get") else t["position_ids"]
    if positions is None:
        return
    media = (batch.non_tensor_batch or {}).get("multi_modal_data")
    for s in rows:
        attention = t["attention_mask"][s]
        text = (attention.long().cumsum(-1) - 1).clamp(min=0)
        if positions.dim() == 2:
            positions[s] = text
            continue
        item = media[s] if media is not None else None
        entries = list((item or {}).get("images", (item or {}).get("image")) or []) if isinstance(item, Mapping) else []
        grids = guard._grids([entry_image(e) for e in entries], band)
        rope = guard.oracle.rope_index(t["input_ids"][s].long(), attention, grids)
        positions[s] = torch.cat([text[None], rope]) if positions.shape[1] == 4 else rope
