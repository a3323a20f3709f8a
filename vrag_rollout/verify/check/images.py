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
    everything else (stray starts/ends/pads, video tokens, vision tokens in padding)."""
    s, ids, attended = row.index, row.ids.tolist(), row.attention.tolist()
    fails, blocks, i = [], [], 0
    inside: set[int] = set()
    while i < len(ids):
        if attended[i] and ids[i] == oracle.vision_start:
            j = i + 1
            while j < len(ids) and ids[j] == oracle.image_pad and attended[j]:
                j += 1
            if j > i + 1 and j < len(ids) and ids[j] == oracle.vision_end and attended[j]:
                blocks.append((i + 1, j))
                inside.update(range(i, j + 1))
                i = j + 1
                continue
            what = "image pads then" if j > i + 1 else "an image pad and"
            fails.append(Failure("image_tokens", s, j, f"vision start at {i} is not followed by {what} a vision end "
                                 f"(found token {ids[j] if j < len(ids) else 'end'})"))
            inside.update(range(i, j))
            i = j
            continue
        i += 1
    for p, token in enumerate(ids):
        if token in oracle.vision_ids and p not in inside:
            kind = "video token (videos are not supported)" if token == oracle.video_pad else "stray vision token"
            where = "" if attended[p] else " in padding"
            fails.append(Failure("image_tokens", s, p, f"{kind} {token}{where}"))
    return blocks, fails


def vision_in_loss(row: Row, oracle: ModelOracle) -> list[Failure]:
    """A vision token in the loss mask: sampled by the policy, or trained on."""
    return [Failure("image_tokens", row.index, p, "vision token in the loss mask (sampled or trained on)")
            for p in (row.loss.nonzero().flatten() + row.prompt_len).tolist() if int(row.ids[p]) in oracle.vision_ids]


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
