"""Image-token checks ("image_tokens"): the vision tokens of a sample against its saved images.

Contract: `check_images(row, saved, oracle)` checks that every `<|image_pad|>` run is whole and
wrapped by vision start/end, one run per saved image in sequence order, each as long as the
processor's own expansion of that image (the model's processor re-run on the saved image after
`trainer_rescale`, the trainer's pixel rule); no stray vision tokens anywhere (video tokens
included), none in the loss mask; retrieved pages (runs in the response) inside the recorded
page pixel band. It returns (failures, the processor's `image_grid_thw` for the position check,
or None when the pad runs do not match the images, the processor outputs for the forward pass).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from PIL import Image

from ..saved_batch import SavedBatch
from .oracle import ModelOracle
from .report import Failure
from .rows import Row


def rescaled_size(width: int, height: int, min_pixels: Optional[int], max_pixels: Optional[int]) -> tuple[int, int]:
    """The trainer's pixel rule (EasyR1's dataset and actor) on a size: scale down past
    max_pixels, up below min_pixels, each by sqrt of the pixel ratio with sides truncated."""
    for limit, too_far in ((max_pixels, lambda a: a > max_pixels), (min_pixels, lambda a: a < min_pixels)):
        if limit and too_far(width * height):
            scale = math.sqrt(limit / (width * height))
            width, height = int(width * scale), int(height * scale)
    return width, height


def trainer_rescale(image: Image.Image, min_pixels: Optional[int], max_pixels: Optional[int]) -> Image.Image:
    """The image as the trainer's pixel rule (`rescaled_size`) leaves it, in RGB."""
    size = rescaled_size(image.width, image.height, min_pixels, max_pixels)
    if size != image.size:
        image = image.resize(size)
    return image if image.mode == "RGB" else image.convert("RGB")


def vision_blocks(row: Row, oracle: ModelOracle) -> tuple[list[tuple[int, int]], list[Failure]]:
    """Pad runs [start, end) of well-formed vision blocks over the attended tokens; failures for
    everything else (stray starts/ends/pads, video tokens, vision tokens in padding).

    Every attended vision start opens a block (a block's own tokens are never starts); its pad
    run ends at the first token that is not an attended image pad. The scans over the row are
    tensor ops; Python loops only over the (few) starts and stray tokens."""
    s, ids = row.index, row.ids
    attended = row.attention != 0
    length = len(ids)
    starts = ((ids == oracle.vision_start) & attended).nonzero().flatten().tolist()
    # Positions that end a pad run: anything but an attended image pad (and the row's end).
    run_ends = torch.cat([(~((ids == oracle.image_pad) & attended)).nonzero().flatten(), torch.tensor([length])])
    after = run_ends[torch.searchsorted(run_ends, torch.tensor(starts, dtype=run_ends.dtype) + 1)].tolist()
    fails, blocks = [], []
    inside = torch.zeros(length + 1, dtype=torch.long)  # +1 where a block's span opens, -1 past it
    for i, j in zip(starts, after):
        closed = j > i + 1 and j < length and int(ids[j]) == oracle.vision_end and bool(attended[j])
        if closed:
            blocks.append((i + 1, j))
        else:
            what = "image pads then" if j > i + 1 else "an image pad and"
            fails.append(Failure("image_tokens", s, j, f"vision start at {i} is not followed by {what} a vision end "
                                 f"(found token {int(ids[j]) if j < length else 'end'})"))
        inside[i] += 1
        inside[j + 1 if closed else j] -= 1  # a closed block spans its end token too
    inside = inside.cumsum(0)[:length] > 0
    vision = torch.isin(ids, torch.tensor(sorted(oracle.vision_ids), dtype=ids.dtype))
    for p in (vision & ~inside).nonzero().flatten().tolist():
        token = int(ids[p])
        kind = "video token (videos are not supported)" if token == oracle.video_pad else "stray vision token"
        where = "" if attended[p] else " in padding"
        fails.append(Failure("image_tokens", s, p, f"{kind} {token}{where}"))
    return blocks, fails


def vision_in_loss(row: Row, oracle: ModelOracle) -> list[Failure]:
    """A vision token in the loss mask: sampled by the policy, or trained on."""
    P = row.prompt_len
    vision = torch.isin(row.ids[P:], torch.tensor(sorted(oracle.vision_ids), dtype=row.ids.dtype))
    flagged = (vision & (row.sampled != 0)).nonzero().flatten()  # response positions, in order
    return [Failure("image_tokens", row.index, p, "vision token in the loss mask (sampled or trained on)")
            for p in (flagged + row.prompt_len).tolist()]


def check_images(row: Row, saved: SavedBatch,
                 oracle: ModelOracle) -> tuple[list[Failure], Optional[torch.Tensor], Any]:
    """Failures, the processor's grids (None when the tokens do not match the images), outputs."""
    s, P = row.index, row.prompt_len
    blocks, fails = vision_blocks(row, oracle)
    fails += vision_in_loss(row, oracle)
    images = saved.decoded_images(s)
    band = saved.pixel_band
    views = [trainer_rescale(image, band.get("trainer_min_pixels"), band.get("trainer_max_pixels")) for image in images]
    lengths, grids, outputs = oracle.expand_images(views)
    if len(blocks) != len(images):
        fails.append(Failure("image_tokens", s, blocks[0][0] if blocks else None,
                             f"{len(blocks)} image pad runs but {len(images)} saved images"))
        return fails, None, outputs
    ordered = True
    for k, ((start, end), want) in enumerate(zip(blocks, lengths)):
        if end - start != want:
            ordered = False
            fails.append(Failure("image_tokens", s, start,
                                 f"image {k}: pad run of {end - start} tokens at [{start}, {end}), the processor "
                                 f"expands this image to {want} ({images[k].width}x{images[k].height} px)"))
    if not ordered and sorted(end - start for start, end in blocks) == sorted(lengths):
        fails.append(Failure("image_tokens", s, blocks[0][0],
                             "the pad runs fit the saved images in another order: images in the wrong order? "
                             f"(pad runs {[e - b for b, e in blocks]}, images expand to {lengths})"))
    low, high = band.get("page_min_pixels"), band.get("page_max_pixels")
    if low and high:
        for k, (start, _) in enumerate(blocks):
            area = images[k].width * images[k].height
            if start >= P and not low <= area <= high:
                fails.append(Failure("image_tokens", s, start, f"retrieved page (image {k}) has {area} pixels, "
                                     f"outside the page band [{low}, {high}]"))
    return fails, (grids if ordered else None), outputs
