"""One `multi_modal_data` image entry, of any kind a trainer batch holds, as bytes or as pixels.

Contract: `entry_bytes(entry)` and `entry_image(entry)` accept every kind the trainers put in
`multi_modal_data`: a PIL image; an object carrying its decoded page (`.image`, the rollout's
page entries); raw bytes (`bytes`, `bytearray`, `memoryview`); a dict with `bytes` or, when
those are None, `path` (a parquet image column, EasyR1's `image_dir` datasets); a path (`str`,
`os.PathLike`); a numpy array. Anything else raises `TypeError` naming the kind. The same entry
gives the same pixels through both functions (`entry_image` decodes what `entry_bytes` encodes,
except that a PIL image or array is used as it is). `verify/` reads images only through here.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from PIL import Image


def entry_bytes(entry: Any) -> bytes:
    """The entry as encoded image bytes (stored bytes as they are, a file's bytes, PIL -> PNG)."""
    if isinstance(entry, (bytes, bytearray, memoryview)):
        return bytes(entry)
    if isinstance(entry, Mapping):
        if entry.get("bytes") is not None:
            return bytes(entry["bytes"])
        if entry.get("path"):
            return Path(entry["path"]).read_bytes()
        raise TypeError(f"image entry dict has neither 'bytes' nor 'path' (keys {sorted(entry)})")
    if isinstance(entry, (str, os.PathLike)):
        return Path(entry).read_bytes()
    if not (isinstance(entry, (Image.Image, np.ndarray)) or isinstance(getattr(entry, "image", None), Image.Image)):
        raise TypeError(f"cannot encode an image entry of type {type(entry).__name__}")
    image = entry_image(entry)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def entry_image(entry: Any) -> Image.Image:
    """The entry's pixels: PIL as it is, a page entry's decoded image, an array as an image, and
    anything encoded decoded (loaded, the file closed)."""
    if isinstance(entry, Image.Image):
        return entry
    if isinstance(getattr(entry, "image", None), Image.Image):
        return entry.image
    if isinstance(entry, np.ndarray):
        return Image.fromarray(entry)
    if not isinstance(entry, (bytes, bytearray, memoryview, Mapping, str, os.PathLike)):
        raise TypeError(f"cannot read an image entry of type {type(entry).__name__}")
    with Image.open(io.BytesIO(entry_bytes(entry))) as image:
        image.load()
        return image.copy()
