"""The prompt's own images: read the trainer's entries and size them as the trainer's actor will.

EasyR1 keeps raw entries (PIL images, `{"bytes": ...}` dicts, bytes or paths) in
`multi_modal_data` and every consumer first rescales them into the data config's
[min_pixels, max_pixels] (passed in meta_info). The engine must see the same pixels as the actor,
so the rollout applies that same rescale before handing prompt images to vLLM, and returns the
original entries untouched.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from PIL import Image


def image_key(column: Any) -> str:
    """The trainer's key for images: "images" (current EasyR1) or "image" (v0.3)."""
    if column is not None:
        for item in column:
            if isinstance(item, dict) and item:
                return "image" if "image" in item and "images" not in item else "images"
    return "images"


def prompt_entries(column: Any, size: int) -> list[list[Any]]:
    """The raw image entries of each prompt (empty lists when the batch has no images)."""
    if column is None:
        return [[] for _ in range(size)]
    out = []
    for item in column:
        entries = item.get("images", item.get("image")) if isinstance(item, dict) else None
        out.append(list(entries or []))
    return out


def to_pil(entry: Any) -> Image.Image:
    """A `multi_modal_data` entry as PIL: a PIL image; a page entry's decoded image; raw bytes; a
    dict with `bytes` or, when those are None, `path` (a parquet image column); a path; an array."""
    if isinstance(entry, Image.Image):
        return entry
    if isinstance(getattr(entry, "image", None), Image.Image):
        return entry.image
    if isinstance(entry, np.ndarray):
        return Image.fromarray(entry)
    if isinstance(entry, Mapping):
        if entry.get("bytes") is not None:
            entry = entry["bytes"]
        elif entry.get("path"):
            entry = entry["path"]
        else:
            raise TypeError(f"a prompt image dict has neither 'bytes' nor 'path' (keys {sorted(entry)})")
    if isinstance(entry, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(bytes(entry)))
    if isinstance(entry, (str, os.PathLike)):
        return Image.open(os.fspath(entry))
    raise TypeError(f"cannot read a prompt image of type {type(entry).__name__}")


def rescale_into(image: Image.Image, min_pixels: Optional[int], max_pixels: Optional[int]) -> Image.Image:
    """Scale down past max_pixels, then up below min_pixels (sides truncated to ints), RGB.

    This is the trainer-side rule, so the engine and the actor process identical pixels.
    """
    if max_pixels and image.width * image.height > max_pixels:
        factor = math.sqrt(max_pixels / (image.width * image.height))
        image = image.resize((int(image.width * factor), int(image.height * factor)))
    if min_pixels and image.width * image.height < min_pixels:
        factor = math.sqrt(min_pixels / (image.width * image.height))
        image = image.resize((int(image.width * factor), int(image.height * factor)))
    return image if image.mode == "RGB" else image.convert("RGB")


def engine_images(entries: list[Any], meta: dict) -> list[Image.Image]:
    return [rescale_into(to_pil(entry), meta.get("min_pixels"), meta.get("max_pixels")) for entry in entries]
